#!/bin/sh
# The compose broker: one KRaft node, broker and controller, with the settings infra/kafka uses
# for tests (no topic auto-creation: the service's catalog creates its topics; 16 MiB records).
# Formats the storage on first start (KAFKA_CLUSTER_ID, or a random id), then runs kafka.Kafka.
#   KAFKA_ADVERTISED_LISTENERS  default PLAINTEXT://kafka:9092 (the compose service's name)
#   KAFKA_HEAP                  default 512m
set -eu
data=/var/lib/kafka/data
props=/opt/kafka/server.properties
cat >"$props" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
listeners=PLAINTEXT://0.0.0.0:9092,CONTROLLER://127.0.0.1:9093
advertised.listeners=${KAFKA_ADVERTISED_LISTENERS:-PLAINTEXT://kafka:9092}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$data
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
message.max.bytes=16777216
replica.fetch.max.bytes=16777216
log.cleaner.dedupe.buffer.size=16777216
num.network.threads=2
num.io.threads=4
PROPS
set -- -Xms128m "-Xmx${KAFKA_HEAP:-512m}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
  -Dlog4j2.configurationFile=/opt/kafka/log4j2.xml -cp '/opt/kafka/libs/*'
if [ ! -f "$data/meta.properties" ]; then
  id=${KAFKA_CLUSTER_ID:-}
  # Kafka's form: 16 random bytes, URL-safe base64 without padding, never starting with "-".
  while [ -z "$id" ] || [ "${id#-}" != "$id" ]; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
  done
  java -XX:TieredStopAtLevel=1 "$@" kafka.tools.StorageTool format -t "$id" -c "$props" >/dev/null
fi
exec java "$@" kafka.Kafka "$props"
