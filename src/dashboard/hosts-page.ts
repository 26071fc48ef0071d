// /hosts: the fleet by host, from the facts every live worker reports to Redis (host-facts.ts): its
// workers (with their concurrency allowance), engine, runtime generation, images and free disk. /hosts.json gives the same as JSON.
import { Router } from 'express';
import type { Redis } from 'ioredis';
import { readHostFacts, type WorkerFacts } from '../worker/host-facts.ts';
import { layout, type Links } from './batch-view.ts';
import { html } from './html.ts';

const gib = (bytes: number) => (bytes < 0 ? 'unknown' : `${(bytes / 2 ** 30).toFixed(1)} GiB`);

/** What the running environments take of the worker's budget: memory (and CPUs when counted), containers, waiting episodes. */
function budgetCell(w: WorkerFacts): string {
  const b = w.budget;
  if (b === undefined) return '';
  const cpus = b.cpus === undefined ? '' : `, ${b.usedCpus} of ${b.cpus} CPUs`;
  return `${b.usedMemoryMb} of ${b.memoryMb ?? 'unlimited'} MiB${cpus}, ${b.containers} container(s)${b.waiting > 0 ? `, ${b.waiting} waiting` : ''}`;
}

export function hostsPage(opts: { redis: Redis; prefix: string; links: Links }): Router {
  const router = Router();
  router.get('/hosts.json', async (_req, res) => {
    res.json({ workers: await readHostFacts(opts.redis, opts.prefix) });
  });
  router.get('/hosts', async (_req, res) => {
    const facts = await readHostFacts(opts.redis, opts.prefix);
    const byHost = new Map<string, WorkerFacts[]>();
    for (const f of facts) byHost.set(`${f.host} / ${f.engineId}`, [...(byHost.get(`${f.host} / ${f.engineId}`) ?? []), f]);
    const body = facts.length === 0
      ? html`<p>No live worker reports its facts.</p>`
      : html`${[...byHost.entries()].map(([host, workers]) => html`<h2>${host}</h2>
<table><tr><th>worker</th><th>pid</th><th>concurrency</th><th>environments</th><th>runtime generation</th><th>images</th><th>free disk</th><th>reported</th></tr>
${workers.map((w) => html`<tr><td>${w.workerId}</td><td>${w.pid}</td><td>${w.admission?.autotune ? `${w.admission.allowance} of ${w.concurrency} (self-tuning)` : w.concurrency}</td><td>${budgetCell(w)}</td><td>${w.runtimeGeneration?.slice(0, 12) ?? 'not yet'}</td><td>${w.images.filter((i) => !i.startsWith('sha256:')).join(', ')}</td><td>${gib(w.freeDiskBytes)}</td><td>${w.reportedAt}</td></tr>`)}
</table>`)}`;
    res.type('html').send(layout('Hosts', opts.links, body).value);
  });
  return router;
}
