# The service (`svc run <service...>`) on the base image built from a debootstrap root
# filesystem: the sandbox runtime's Debian packages, the build machine's node binary, the
# project's production node_modules (chdb's native library included; npm never runs here),
# its sources, and the sandbox image `debian:bookworm` in the image store. Built by
# infra/compose/build-images.sh from a temporary context (bin/node, app/, sandbox-images.tar).
ARG BASE
FROM ${BASE}
ARG PACKAGES
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tini ${PACKAGES} >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY bin/node /usr/local/bin/node
# The image store of the sandbox runners: /data/images (SVC_DATA_DIR=/data) points here.
ADD sandbox-images.tar /opt/svc/
RUN mkdir -p /data /blobs && ln -s /opt/svc/images /data/images
COPY node_modules /app/node_modules
COPY app /app
WORKDIR /app
# tsx's cache of the compiled sources (/tmp/tsx-0), so the processes do not all compile them at
# start. Importing main.ts loads every service without starting one.
RUN node --import tsx --input-type=module -e "await import('/app/services/main.ts'); await import('/app/services/sandbox-runner/images/images.ts')"
ENV SVC_DATA_DIR=/data
EXPOSE 8080
# tini reaps what the sandboxes leave behind and forwards SIGTERM for the graceful stop.
ENTRYPOINT ["/usr/bin/tini", "--", "node", "/app/bin/svc.cjs"]
# The embedded default (every service in one process); docker-compose.yml runs them apart.
CMD ["start"]
