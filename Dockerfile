# The fleet image: the compiled rollout-fleet CLI with its production dependencies; one image for the
# worker, dashboard and model-stub services of docker-compose.yml. Workers started from it need the
# host's Docker socket mounted (that is root on the host: see README, Operations).

# Build stage: `npm ci` runs the prepare script, which compiles src/ and queues/ to dist/ with tsc and
# copies the Redis scripts (src/redis/lua/*.lua) to dist/src/redis/lua/, where the compiled code reads them.
FROM node:20-bookworm-slim AS build
WORKDIR /opt/rollout-fleet
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
COPY src ./src
COPY queues ./queues
RUN npm ci --no-audit --no-fund

FROM node:20-bookworm-slim
WORKDIR /opt/rollout-fleet
# patchelf: the runtime generation's portable node (src/runtime/portable-node.ts).
RUN apt-get update && apt-get install -y --no-install-recommends patchelf && rm -rf /var/lib/apt/lists/*
COPY package.json package-lock.json ./
# No scripts: prepare (the build) needs the dev dependencies; dist/ comes from the build stage.
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund
COPY --from=build /opt/rollout-fleet/dist ./dist
COPY examples ./examples
ENV NODE_ENV=production
# `rollout-fleet dashboard` listens here when FLEET_DASHBOARD_PORT is not set.
EXPOSE 3000
ENTRYPOINT ["node", "dist/src/cli/bin.js"]
CMD ["worker"]
