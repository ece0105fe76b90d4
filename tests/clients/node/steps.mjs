// The scripted tool every Node client test offers: run_step({step}) prints a deterministic build
// log of about `tokens` tokens, then the simulator directive that makes the model call the next
// step ([[call run_step {"step": N+1}]], simulator/script.py); the last step prints
// "CHAIN COMPLETE after N steps" so the model answers in text. Step 1 plants a fact that a later
// "RECALL:" question can only answer through the gateway's recall tools once it is compacted away.

export const FACT = 'NOTE The staging deploy id is DEP-58213; use it for every rollback.';
export const QUESTION = 'RECALL: What is the staging deploy id?';
export const TOOL_NAME = 'run_step';
export const TOOL_DESCRIPTION = 'Run one step of the build chain and print its log.';
export const TOOL_PARAMETERS = {
  type: 'object',
  properties: { step: { type: 'integer', description: 'The step number, from 1.' } },
  required: ['step'],
  additionalProperties: false,
};

const WORDS = ('cache worker queue request handler retry timeout config module import build deploy ' +
  'index schema migration token client server stream buffer socket parser render template session ' +
  'ledger summary window budget tenant metric latency thread signal process memory record field').split(' ');

function rng(seed) {  // mulberry32: the same log for the same step on every run
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function runStep(step, total, tokens) {
  const next = rng(step * 7919);
  const pick = () => WORDS[Math.floor(next() * WORDS.length)];
  const lines = [`step ${step} of ${total}`];
  for (let i = 0; i < Math.floor(tokens / 21); i++) {  // a line is about 21 tokens
    const words = Array.from({ length: 10 }, pick).join(' ');
    lines.push(`2026-11-${String(1 + (i % 28)).padStart(2, '0')}T10:${String(i % 60).padStart(2, '0')} INFO step${step} ${pick()}: ${words}`);
  }
  if (step === 1) lines.splice(Math.floor(lines.length / 2), 0, FACT);
  lines.push(step >= total ? `CHAIN COMPLETE after ${total} steps`
    : `next: [[call ${TOOL_NAME} ${JSON.stringify({ step: step + 1 })}]]`);
  return lines.join('\n');
}

export function config() {
  return JSON.parse(process.argv[2]);
}

export function report(value) {
  process.stdout.write(JSON.stringify(value) + '\n');
}
