// The sequencer of the service tests: heaviest files first (longest-processing-time first), so the two
// workers do not end with one long file running alone while the other core idles. The figures are one
// whole-suite run on 2 cores (2026-12-02, seconds per file, under the suite's own load); they steer the
// order only, never what runs. A file not listed (new) is taken for a heavy one and goes early.
import type { TestSpecification } from 'vitest/node';
import { BaseSequencer } from 'vitest/node';
import path from 'node:path';

const MEASURED_SEC: Record<string, number> = {
  'test/integration/python-client.test.ts': 118, // measured alone (2026-12-03), under other sessions' load
  'test/integration/api-trainer-edges.test.ts': 35, // measured alone (2026-12-03)
  // Measured alone, load 7 to 20 on 2 cores (2026-12-03): 20 kill -9s of workers running three-service episodes.
  'test/integration/harbor-services-kill.test.ts': 139,
  'test/integration/api-hostile.test.ts': 76,
  'test/integration/two-hosts.test.ts': 74,
  'test/integration/phase-reserves.test.ts': 74,
  'test/integration/bad-input-corpus.test.ts': 66,
  // Measured alone (they build images: heavy on the engine's disk, so not first beside api-hostile).
  'test/integration/harbor-tasks.test.ts': 58,
  'test/integration/harbor-hostile.test.ts': 55,
  'test/integration/environment-build.test.ts': 30,
  'test/integration/terminal-bench-1.test.ts': 30,
  'test/integration/harbor-separate-verifier.test.ts': 30,
  'test/integration/harbor-steps.test.ts': 30,
  'test/integration/harbor-services-modes.test.ts': 25,
  // Measured alone (32 tests, 47 s; its 1 GiB disk fills and the retried infra error included).
  'test/integration/services-hostile.test.ts': 47,
  'test/integration/llm-agent.test.ts': 63,
  'test/integration/worker-faults.test.ts': 63,
  'test/integration/evidence.test.ts': 62,
  'test/integration/chaos.test.ts': 61,
  'test/integration/sandbox-pool.test.ts': 47,
  'test/integration/gateway-hostile.test.ts': 46,
  'test/integration/redis-outage.test.ts': 46,
  'test/integration/compose-stack.test.ts': 43,
  'test/integration/engine-outage.test.ts': 37,
  'test/integration/episode.test.ts': 36,
  'test/integration/admission.test.ts': 35,
  // Measured alone (2 tests, 25 to 37 s, load 15 to 19 on 2 cores): six episodes under a memory budget.
  'test/integration/admission-cost.test.ts': 37,
  'test/integration/pipeline.test.ts': 32,
  'test/integration/evidence-attacks.test.ts': 30,
  'test/integration/fleet-client.test.ts': 29,
  'test/integration/checkpoint-writer-kill.test.ts': 27,
  'test/integration/cancel.test.ts': 27,
  'test/integration/fleet-limits.test.ts': 26,
  'test/integration/dashboard-pages.test.ts': 25,
  'test/integration/sandbox.test.ts': 25,
  'test/integration/api-stream.test.ts': 25,
  'test/integration/resume.test.ts': 22,
  'test/integration/verify-evasion.test.ts': 20,
  'test/integration/artifact-store-faults.test.ts': 20,
  'test/integration/retry-kind.test.ts': 20,
  'test/integration/model-rate-limit.test.ts': 19,
  'test/integration/reaper.test.ts': 18,
  'test/integration/disk-quota.test.ts': 17,
  'test/integration/runtime.test.ts': 17,
  'test/integration/model-gateway.test.ts': 16,
  'test/integration/token-capture.test.ts': 15,
  'test/integration/drain.test.ts': 14,
  'test/integration/model-stub-sandbox.test.ts': 11,
  // Measured alone (21 s of tests, the Python trainer's batch included).
  'test/integration/reward-file-tasks.test.ts': 24,
  // Measured alone (5 tests, 18 s): gVisor sessions (one OOM-killed), three episodes (own, warm, Harbor), the refused setting.
  'test/integration/gvisor-runtime.test.ts': 18,
  'test/integration/dashboard.test.ts': 11,
  'test/integration/bad-input.test.ts': 11,
  'test/integration/api-batches.test.ts': 10,
  'test/integration/cli-conventions.test.ts': 10,
  'test/integration/disk-full.test.ts': 9,
  'test/integration/transcript.test.ts': 9,
  'test/integration/artifact-store.test.ts': 7,
  'test/integration/model-stub.test.ts': 7,
  'test/integration/compose-file.test.ts': 6,
  'test/integration/hostile-sandbox.test.ts': 5,
  'test/integration/large-batch.test.ts': 3,
  'test/integration/model-stream.test.ts': 2,
  'test/integration/checkpoints.test.ts': 1,
  'test/integration/model-proxy.test.ts': 1,
  'test/integration/checkpoint-fence.test.ts': 0,
  'test/integration/client-streams.test.ts': 0,
};
/** A file not measured yet: assumed as long as a heavy one, so it cannot end the run alone. */
const UNKNOWN_SEC = 60;

export class HeaviestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const weight = (spec: TestSpecification) => {
      const rel = path.relative(spec.project.config.root, spec.moduleId).split(path.sep).join('/');
      return MEASURED_SEC[rel] ?? UNKNOWN_SEC;
    };
    // Groups keep their order (the unit group runs before the service group); within one, heaviest first.
    return [...files].sort((a, b) => a.project.config.sequence.groupOrder - b.project.config.sequence.groupOrder || weight(b) - weight(a));
  }
}
