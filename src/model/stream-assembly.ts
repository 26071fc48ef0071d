// Reassembles a streamed chat completion (chat.completion.chunk objects) into the chat.completion a
// non-streamed call would have returned: content and tool-call arguments concatenated per choice,
// logprobs and token ids (vLLM's `token_ids`, `prompt_token_ids`) appended in order, the last usage
// and finish reason kept. The call's evidence and trajectory are written from this, so a trainer reads
// one shape whether the agent streamed or not.

type Json = Record<string, unknown>;

interface ToolCallParts {
  id?: string;
  type?: string;
  name: string;
  arguments: string;
}

interface ChoiceParts {
  role?: string;
  content: string;
  /** Whether any chunk carried a content string (null content stays null, as in a tool-call answer). */
  sawContent: boolean;
  reasoning: string;
  toolCalls: Map<number, ToolCallParts>;
  finishReason: unknown;
  logprobs: unknown[];
  sawLogprobs: boolean;
  tokenIds: number[];
  sawTokenIds: boolean;
}

const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);
const isIndex = (v: unknown): v is number => Number.isInteger(v) && (v as number) >= 0 && (v as number) < 1024;

export class StreamAssembler {
  private id: unknown;
  private model: unknown;
  private created: unknown;
  private systemFingerprint: unknown;
  private usage: unknown;
  private promptTokenIds: unknown;
  private readonly choices = new Map<number, ChoiceParts>();
  /** Chunks taken in. */
  chunks = 0;

  /** Take one chunk (a parsed `data:` event). Fields it does not know are ignored. */
  push(chunk: Json): void {
    this.chunks += 1;
    this.id ??= chunk.id;
    this.model ??= chunk.model;
    this.created ??= chunk.created;
    this.systemFingerprint ??= chunk.system_fingerprint;
    if (chunk.usage !== undefined && chunk.usage !== null) this.usage = chunk.usage;
    if (Array.isArray(chunk.prompt_token_ids)) this.promptTokenIds = chunk.prompt_token_ids;
    if (!Array.isArray(chunk.choices)) return;
    for (const choice of chunk.choices) {
      if (!isObject(choice)) continue;
      const index = isIndex(choice.index) ? choice.index : 0;
      let parts = this.choices.get(index);
      if (parts === undefined) {
        parts = { content: '', sawContent: false, reasoning: '', toolCalls: new Map(), finishReason: null, logprobs: [], sawLogprobs: false, tokenIds: [], sawTokenIds: false };
        this.choices.set(index, parts);
      }
      const delta = isObject(choice.delta) ? choice.delta : {};
      if (typeof delta.role === 'string') parts.role ??= delta.role;
      if (typeof delta.content === 'string') {
        parts.content += delta.content;
        parts.sawContent = true;
      }
      const reasoning = delta.reasoning_content ?? delta.reasoning;
      if (typeof reasoning === 'string') parts.reasoning += reasoning;
      if (Array.isArray(delta.tool_calls)) {
        for (const call of delta.tool_calls) {
          if (!isObject(call)) continue;
          const callIndex = isIndex(call.index) ? call.index : parts.toolCalls.size;
          let tool = parts.toolCalls.get(callIndex);
          if (tool === undefined) {
            tool = { name: '', arguments: '' };
            parts.toolCalls.set(callIndex, tool);
          }
          if (typeof call.id === 'string') tool.id ??= call.id;
          if (typeof call.type === 'string') tool.type ??= call.type;
          const fn = isObject(call.function) ? call.function : {};
          if (typeof fn.name === 'string') tool.name += fn.name;
          if (typeof fn.arguments === 'string') tool.arguments += fn.arguments;
        }
      }
      if (choice.finish_reason !== undefined && choice.finish_reason !== null) parts.finishReason = choice.finish_reason;
      if (isObject(choice.logprobs) && Array.isArray(choice.logprobs.content)) {
        parts.logprobs.push(...(choice.logprobs.content as unknown[]));
        parts.sawLogprobs = true;
      }
      if (Array.isArray(choice.token_ids)) {
        parts.tokenIds.push(...(choice.token_ids as number[]));
        parts.sawTokenIds = true;
      }
    }
  }

  /** The chat.completion the chunks add up to. */
  result(): Json {
    const choices = [...this.choices.entries()].sort(([a], [b]) => a - b).map(([index, parts]) => {
      const toolCalls = [...parts.toolCalls.entries()].sort(([a], [b]) => a - b).map(([, t]) => ({
        id: t.id ?? '',
        type: t.type ?? 'function',
        function: { name: t.name, arguments: t.arguments },
      }));
      const message: Json = {
        role: parts.role ?? 'assistant',
        content: parts.sawContent ? parts.content : null,
        ...(parts.reasoning !== '' && { reasoning_content: parts.reasoning }),
        ...(toolCalls.length > 0 && { tool_calls: toolCalls }),
      };
      return {
        index,
        message,
        finish_reason: parts.finishReason,
        ...(parts.sawLogprobs && { logprobs: { content: parts.logprobs } }),
        ...(parts.sawTokenIds && { token_ids: parts.tokenIds }),
      };
    });
    return {
      id: this.id,
      object: 'chat.completion',
      created: this.created,
      model: this.model,
      ...(this.systemFingerprint !== undefined && { system_fingerprint: this.systemFingerprint }),
      choices,
      ...(this.usage !== undefined && { usage: this.usage }),
      ...(this.promptTokenIds !== undefined && { prompt_token_ids: this.promptTokenIds }),
    };
  }
}
