import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Partitioners } from 'kafkajs';
import { murmur2, partitionForKey } from '../../services/kernel/log/murmur2.ts';

function kafkajsPartition(key: string | Buffer, partitions: number): number {
  const partitioner = Partitioners.DefaultPartitioner();
  const partitionMetadata = Array.from({ length: partitions }, (_, i) => ({
    partitionId: i,
    leader: 1,
    partitionErrorCode: 0,
    replicas: [1],
    isr: [1],
  }));
  return partitioner({ topic: 't', partitionMetadata, message: { key, value: null } });
}

test('murmur2 matches known Java values', () => {
  // Values from Kafka's UtilsTest (org.apache.kafka.common.utils.UtilsTest#testMurmur2).
  const cases: Array<[string, number]> = [
    ['21', -973932308],
    ['foobar', -790332482],
    ['a-little-bit-long-string', -985981536],
    ['a-little-bit-longer-string', -1486304829],
    ['lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8', -58897971],
    ['abc', 479470107],
  ];
  for (const [key, expected] of cases) assert.equal(murmur2(key), expected, key);
});

test('partitionForKey agrees with kafkajs DefaultPartitioner for many keys', () => {
  const keys: Array<string | Buffer> = ['', 'a', 'ab', 'abc', 'abcd', 'é', '日本語', '🦀🦀'];
  for (let i = 0; i < 3000; i++) keys.push(`tenant-${i}`);
  for (let i = 0; i < 2000; i++) keys.push(randomBytes(1 + (i % 40)).toString('base64'));
  for (let i = 0; i < 500; i++) keys.push(randomBytes(1 + (i % 33)));
  for (const partitions of [1, 3, 7, 12, 64]) {
    for (const key of keys) {
      assert.equal(partitionForKey(key, partitions), kafkajsPartition(key, partitions), `key=${String(key)} n=${partitions}`);
    }
  }
});
