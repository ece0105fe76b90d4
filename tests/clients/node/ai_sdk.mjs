// The Vercel AI SDK's own agent loop against the gateway: generateText or streamText with the
// run_step tool and stopWhen: stepCountIs(...), on one of the three APIs (`openai(id)`: Responses,
// `openai.chat(id)`: Chat Completions, `anthropic(id)`: Messages), then one more turn that asks the
// planted fact back (RECALL:). Prints what the client got as one JSON line.
import { generateText, streamText, stepCountIs, tool, jsonSchema } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';
import { QUESTION, TOOL_DESCRIPTION, TOOL_NAME, TOOL_PARAMETERS, config, report, runStep } from './steps.mjs';

const cfg = config();
const headers = { 'X-Session-Id': cfg.session };
let model;
if (cfg.api === 'messages') {
  model = createAnthropic({ baseURL: cfg.baseURL, apiKey: 'sk-ant-client', headers })(cfg.model);
} else {
  const openai = createOpenAI({ baseURL: cfg.baseURL, apiKey: 'sk-client', headers });
  model = cfg.api === 'chat' ? openai.chat(cfg.model) : openai(cfg.model);
}

const results = [];
const tools = {
  [TOOL_NAME]: tool({
    description: TOOL_DESCRIPTION,
    inputSchema: jsonSchema(TOOL_PARAMETERS),
    execute: async ({ step }) => {
      const output = runStep(step, cfg.steps, cfg.tokens);
      results.push(step);
      return output;
    },
  }),
};
// Anthropic prompt caching the way AI SDK users ask for it: a breakpoint on the system prompt.
const instructions = {
  role: 'system', content: 'You are a build agent. Run every step the tool output names.',
  providerOptions: { anthropic: { cacheControl: { type: 'ephemeral', ttl: '1h' } } },
};

async function turn(messages, providerOptions) {
  // cfg.providerOptions: the run's own (reasoning, store, include), under a turn's own.
  providerOptions = { ...cfg.providerOptions, ...providerOptions };
  const options = { model, tools, instructions, messages, providerOptions, stopWhen: stepCountIs(cfg.steps + 4), maxRetries: 0 };
  if (cfg.mode === 'generate') {
    const result = await generateText(options);
    return { text: result.text, steps: result.steps, id: result.steps.at(-1).response.id, usage: result.totalUsage, messages: result.responseMessages, parts: [] };
  }
  const result = streamText({ ...options, onError: ({ error }) => { throw error; } });
  const parts = [];
  for await (const part of result.fullStream) {
    if (part.type === 'error') throw part.error;
    parts.push(part.type === 'text-delta' ? 'text-delta' : part.type === 'tool-call' ? `tool-call:${part.toolName}` : part.type);
  }
  const steps = await result.steps;
  return { text: await result.text, steps, id: steps.at(-1).response.id, usage: await result.totalUsage,
           messages: await result.responseMessages, parts };
}

function summary(out) {
  const content = out.steps.flatMap((s) => s.content);
  return {
    text: out.text,
    steps: out.steps.length,
    tool_calls: content.filter((p) => p.type === 'tool-call').map((p) => p.toolName),
    tool_errors: content.filter((p) => p.type === 'tool-error').map((p) => `${p.toolName}: ${p.error}`),
    finish: out.steps.map((s) => s.finishReason),
    usage: { input: out.usage.inputTokens, output: out.usage.outputTokens },
    stream_parts: [...new Set(out.parts)],
  };
}

// ...and one on the task message, which the gateway's own breakpoints replace (at most 4 in all).
const history = [{
  role: 'user', content: `Run the build chain, one step at a time, until it says CHAIN COMPLETE. [[call ${TOOL_NAME} {"step": 1}]]`,
  providerOptions: { anthropic: { cacheControl: { type: 'ephemeral', ttl: '1h' } } },
}];
const loop = await turn(history);
history.push(...loop.messages, { role: 'user', content: QUESTION });
const recall = await turn(history);
const got = { loop: summary(loop), recall: summary(recall), results };
if (cfg.previous) {  // Responses only: continue from the stored response instead of resending history
  const next = await turn([{ role: 'user', content: QUESTION }], { openai: { ...cfg.providerOptions?.openai, previousResponseId: recall.id } });
  got.previous = summary(next);
}
report(got);
