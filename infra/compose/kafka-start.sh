#!/bin/sh
# The compose broker: one KRaft node, broker and controller, with the settings infra/kafka uses
# for tests (no topic auto-creation: the service's catalog creates its topics; 16 MiB records),
# written by infra/kafka/kafka.mjs into the image.
# Formats the storage on first start (KAFKA_CLUSTER_ID, or a random id), then runs kafka.Kafka.
#   KAFKA_ADVERTISED_LISTENERS  default PLAINTEXT://kafka:9092 (the compose service's name)
#   KAFKA_HEAP                  default 512m
set -eu
data=/var/lib/kafka/data
props=/opt/kafka/server.properties
# The settings infra/kafka/kafka.mjs writes (server.properties, put in the image at build time);
# only the address the clients are given is decided here. A later key wins in a properties file.
cp /opt/kafka/server.base.properties "$props"
echo "advertised.listeners=${KAFKA_ADVERTISED_LISTENERS:-PLAINTEXT://kafka:9092}" >>"$props"
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
