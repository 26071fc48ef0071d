# The fleet image: the rollout-fleet CLI with its dependencies; one image for the worker, dashboard and
# model-stub services of docker-compose.yml. Workers started from it need the host's Docker socket
# mounted (that is root on the host: see README, Operations).
FROM node:20-bookworm-slim
WORKDIR /opt/rollout-fleet
# patchelf: the runtime generation's portable node (src/runtime/portable-node.ts).
RUN apt-get update && apt-get install -y --no-install-recommends patchelf && rm -rf /var/lib/apt/lists/*
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund
COPY tsconfig.json ./
COPY src ./src
COPY queues ./queues
COPY examples ./examples
ENV NODE_ENV=production
# `rollout-fleet dashboard` listens here when FLEET_DASHBOARD_PORT is not set.
EXPOSE 3000
ENTRYPOINT ["node", "src/cli/bin.js"]
CMD ["worker"]
