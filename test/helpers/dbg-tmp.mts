import { createSecondEngine } from '/work/wt-xfs/test/helpers/second-engine.ts';
const e = await createSecondEngine({ quotaDataRootMb: 1024 });
console.log(e.host);
