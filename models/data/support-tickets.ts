/** The support-ticket task of Baseten's programmatic-training guide, as token data for the engine's tests and benchmark. */
import type { LoadedTokenizer } from '../tokenizers.js';
import type { TrainingDatum } from '../trainer.js';
import { IGNORE_TARGET } from '../trainer.js';

export const TICKETS: [string, 'access' | 'billing'][] = [
  ["I can't log in to my account after resetting my password", 'access'],
  ['I was charged twice for my subscription this month', 'billing'],
  ['My two-factor code never arrives so I am locked out', 'access'],
  ['Please send me an invoice for last quarter', 'billing'],
  ['The SSO login page says my user is not authorized', 'access'],
  ['Why did my card get declined when renewing the plan?', 'billing'],
  ['I need my teammate added to the workspace, he cannot get in', 'access'],
  ['Can I get a refund for the unused seats?', 'billing'],
];

export const EVAL_TICKETS: [string, 'access' | 'billing'][] = [
  ['I forgot my password and the reset link has expired', 'access'],
  ['My bill shows a charge I do not recognise', 'billing'],
];

export function prompt(ticket: string): string {
  return `Classify the support ticket as access or billing. Respond with only the label.\nTicket: ${ticket}\nLabel:`;
}

/** Prompt tokens with -100 targets, then the label and end-of-sequence, each predicted by the position before. */
export function datum(tok: LoadedTokenizer, ticket: string, label: string): TrainingDatum {
  const p = tok.encode(prompt(ticket));
  const completion = [...tok.encode(` ${label}`), tok.eosTokenIds[0]!];
  const tokens = [...p, ...completion];
  const targets = tokens.map((_, i) => (i >= p.length - 1 && i + 1 < tokens.length ? tokens[i + 1]! : IGNORE_TARGET));
  return { tokens, targetTokens: targets, weights: null, logprobs: null, advantages: null };
}
