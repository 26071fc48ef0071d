// The one definition of "a secret's name", used wherever a value is hidden because of the field it
// sits under: error messages (zod-issues.ts) and the dashboard's job data (dashboard/redact.ts).
// Imports nothing, so every layer may use it.

/**
 * Names that end like a secret: apiKey, MODEL_API_KEY, token, accessToken, refresh_token, password,
 * FLEET_DASHBOARD_PASSWORD, Authorization, clientSecret. Anchored at the end, so settings that merely
 * mention one are shown: maxTokens, contextWindowTokens, outputReserveTokens, keep, keys.
 */
export const SECRET_NAME = /(key|token|secret|password|passwd|passphrase|authorization|credentials?|cookie)$/i;

export function isSecretName(name: string): boolean {
  return SECRET_NAME.test(name);
}
