// The `episodes` queue's contract, as its processor and the tests see it: its name, job options and
// payload schemas. They are defined with the domain that owns them (src/episode/episode-job.ts), because producers
// in src/ (the client, the API, the dashboard) must name the queue and may not import queues/.
export * from '../../src/episode/episode-job.ts';
