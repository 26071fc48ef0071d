// The prepare queues' contract, defined with the builds (src/environments/prepare-job.ts).
export * from '../../src/environments/prepare-job.ts';
