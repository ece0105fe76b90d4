// The official Node SDKs' own tool loops against the gateway, streamed: `openai` with
// responses.stream (Responses) or chat.completions.stream (Chat Completions), `@anthropic-ai/sdk`
// with messages.stream (Messages). Each runs the run_step chain, then asks the planted fact back
// (RECALL:), keeping its history the way the SDK's docs do. Prints what the client got.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { QUESTION, TOOL_DESCRIPTION, TOOL_NAME, TOOL_PARAMETERS, config, report, runStep } from './steps.mjs';

const cfg = config();
const headers = { 'X-Session-Id': cfg.session };
const TASK = `Run the build chain, one step at a time, until it says CHAIN COMPLETE. [[call ${TOOL_NAME} {"step": 1}]]`;
const SYSTEM = 'You are a build agent. Run every step the tool output names.';
const calls = [];
const results = [];
const usage = { input: 0, output: 0 };
const events = new Set();

function execute(name, args) {
  calls.push(name);
  if (name !== TOOL_NAME) return `unknown tool ${name}`;
  const { step } = JSON.parse(args);
  results.push(step);
  return runStep(step, cfg.steps, cfg.tokens);
}

async function responses() {
  const client = new OpenAI({ baseURL: cfg.baseURL, apiKey: 'sk-client', defaultHeaders: headers, maxRetries: 0 });
  const tools = [{ type: 'function', name: TOOL_NAME, description: TOOL_DESCRIPTION, parameters: TOOL_PARAMETERS, strict: true }];
  // cfg.chain: the docs' stored-conversation pattern (store true, previous_response_id, only the
  // new items each request); otherwise the whole input every request, store false.
  let input = [{ role: 'user', content: TASK }];
  let previous;
  const texts = [];
  for (const question of [null, QUESTION]) {
    if (question) input.push({ role: 'user', content: question });
    for (;;) {
      const stream = client.responses.stream({
        model: cfg.model, instructions: SYSTEM, input, tools,
        ...(cfg.chain ? { store: true, previous_response_id: previous } : { store: false }) });
      stream.on('event', (event) => events.add(event.type));
      const response = await stream.finalResponse();
      usage.input += response.usage.input_tokens;
      usage.output += response.usage.output_tokens;
      if (cfg.chain) { input = []; previous = response.id; } else input.push(...response.output);
      const pending = response.output.filter((item) => item.type === 'function_call');
      for (const call of pending) {
        input.push({ type: 'function_call_output', call_id: call.call_id, output: execute(call.name, call.arguments) });
      }
      if (!pending.length) { texts.push(response.output_text); break; }
    }
  }
  return texts;
}

async function chat() {
  const client = new OpenAI({ baseURL: cfg.baseURL, apiKey: 'sk-client', defaultHeaders: headers, maxRetries: 0 });
  const tools = [{ type: 'function', function: { name: TOOL_NAME, description: TOOL_DESCRIPTION, parameters: TOOL_PARAMETERS } }];
  const messages = [{ role: 'system', content: SYSTEM }, { role: 'user', content: TASK }];
  const texts = [];
  for (const question of [null, QUESTION]) {
    if (question) messages.push({ role: 'user', content: question });
    for (;;) {
      const stream = client.chat.completions.stream({ model: cfg.model, messages, tools, stream_options: { include_usage: true } });
      stream.on('chunk', (chunk) => events.add(chunk.object));
      const completion = await stream.finalChatCompletion();
      usage.input += completion.usage.prompt_tokens;
      usage.output += completion.usage.completion_tokens;
      const message = completion.choices[0].message;
      messages.push({ role: 'assistant', content: message.content, ...(message.tool_calls?.length && { tool_calls: message.tool_calls }) });
      for (const call of message.tool_calls ?? []) {
        messages.push({ role: 'tool', tool_call_id: call.id, content: execute(call.function.name, call.function.arguments) });
      }
      if (!message.tool_calls?.length) { texts.push(message.content); break; }
    }
  }
  return texts;
}

async function messagesApi() {
  const client = new Anthropic({ baseURL: cfg.root, apiKey: 'sk-ant-client', defaultHeaders: headers, maxRetries: 0 });
  const tools = [{ name: TOOL_NAME, description: TOOL_DESCRIPTION, input_schema: TOOL_PARAMETERS, cache_control: { type: 'ephemeral' } }];
  const messages = [{ role: 'user', content: TASK }];
  const texts = [];
  for (const question of [null, QUESTION]) {
    if (question) messages.push({ role: 'user', content: question });
    for (;;) {
      const stream = client.messages.stream({ model: cfg.model, max_tokens: 1024, system: SYSTEM, messages, tools });
      stream.on('streamEvent', (event) => events.add(event.type));
      const message = await stream.finalMessage();
      usage.input += message.usage.input_tokens;
      usage.output += message.usage.output_tokens;
      messages.push({ role: 'assistant', content: message.content });
      const uses = message.content.filter((block) => block.type === 'tool_use');
      if (!uses.length) { texts.push(message.content.filter((b) => b.type === 'text').map((b) => b.text).join('')); break; }
      messages.push({ role: 'user', content: uses.map((use) => ({
        type: 'tool_result', tool_use_id: use.id, content: execute(use.name, JSON.stringify(use.input)) })) });
    }
  }
  return texts;
}

const run = { responses, chat, messages: messagesApi }[cfg.api];
const [loop, recall] = await run();
report({ loop, recall, calls, results, usage, events: [...events] });
