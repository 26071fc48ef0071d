// The artifact store FLEET_ARTIFACTS names: `s3://bucket/prefix` (with the AWS variables of `env`), an
// absolute folder, or, unset, the fleet's data folder.
import path from 'node:path';
import { parseArtifactsLocation } from './artifacts-location.ts';
import type { ArtifactStore } from './artifact-store.ts';
import { FolderStore } from './folder-store.ts';
import { S3Store } from './s3-store.ts';

export function openArtifactStore(location: string | undefined, dataDir: string, env: NodeJS.ProcessEnv = process.env): ArtifactStore {
  if (location === undefined || location === '') return new FolderStore(path.resolve(dataDir));
  let parsed;
  try {
    parsed = parseArtifactsLocation(location);
  } catch (err) {
    throw new TypeError(`FLEET_ARTIFACTS: ${(err as Error).message} (got ${JSON.stringify(location)})`);
  }
  return parsed.kind === 's3' ? S3Store.fromUrl(location, env) : new FolderStore(parsed.path);
}
