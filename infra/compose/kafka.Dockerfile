# Apache Kafka (KRaft, one node that is broker and controller) on the base image built from a
# debootstrap root filesystem: Debian's JRE, and the broker's jars as infra/kafka resolves them
# from Maven Central (the build context's libs/). Built by infra/compose/build-images.sh.
ARG BASE
FROM ${BASE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY libs/ /opt/kafka/libs/
COPY kafka-start.sh /opt/kafka/kafka-start.sh
COPY server.base.properties /opt/kafka/server.base.properties
COPY kafka-log4j2.xml /opt/kafka/log4j2.xml
RUN chmod 755 /opt/kafka/kafka-start.sh && mkdir -p /var/lib/kafka/data
EXPOSE 9092
HEALTHCHECK --interval=2s --timeout=2s --retries=90 CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9092"]
ENTRYPOINT ["/opt/kafka/kafka-start.sh"]
