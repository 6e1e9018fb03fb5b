import { Tokenizers } from '../models/index.js';
import { datum, EVAL_TICKETS, prompt, TICKETS } from '../models/data/support-tickets.js';

/** What a driver maps onto its SDK; the input file (LOOPS_CONFORMANCE_INPUT) carries the data. */
export const TASKS = {
  'sft-round':
    "the campaign.py round of Baseten's programmatic-training guide: baseline eval, 2 epochs of forward_backward + optim_step, eval, save_state, save_weights_for_sampler, pinned samples, cleanup",
  'rl-step':
    "publish, version-pinned group sampling, ratio-loss forward_backward with the sampler's logprobs, optim_step, publish again, sample again, cleanup",
  'rl-guide-step':
    "the step of Baseten's RL guide: datums as the guide builds them (prompt + completion tokens, no target_tokens, the sampler's logprobs and the advantages at each completion token's own index, prompt positions 0.0), ppo forward_backward, optim_step, publish again, sample again, cleanup",
  'deploy-chat':
    "every guide's last step: train, save_state and save_weights_for_sampler under one name, deploy the sampler checkpoint (POST /v1/loops/checkpoints/deploy), wait until the model deployment is ACTIVE, one greedy chat completion with model = the checkpoint name, deactivate the deployment, cleanup",
  resume: 'save_state, a new trainer from that state with its optimizer (load_state_with_optimizer), continue, cleanup',
  cleanup: 'a task that fails midway (loading a checkpoint that does not exist) and must still deactivate what it created',
} as const;

export type TaskName = keyof typeof TASKS;
export const TASK_NAMES = Object.keys(TASKS) as TaskName[];

export const MODEL = 'Qwen/Qwen3.5-2B';

/** How many optimizer steps each task asks for: more is a double step. */
export const EXPECTED_STEPS: Record<TaskName, number> = { 'sft-round': 2, 'rl-step': 2, 'rl-guide-step': 1, 'deploy-chat': 2, resume: 2, cleanup: 0 };

function wire(tokens: number[], targets: number[]) {
  return {
    model_input: { chunks: [{ type: 'encoded_text', tokens }] },
    loss_fn_inputs: { target_tokens: { data: targets, dtype: 'int64', shape: [targets.length] } },
  };
}

let cached: Record<TaskName, unknown> | undefined;

/** The input of each task: token ids from the model's real tokenizer, and the hyper-parameters. */
export function taskInputs(): Record<TaskName, unknown> {
  if (cached) return cached;
  const tok = new Tokenizers().get(MODEL);
  const data = (list: typeof TICKETS) =>
    list.map(([t, l]) => {
      const d = datum(tok, t, l);
      return wire(d.tokens, d.targetTokens!);
    });
  const train = data(TICKETS);
  const common = { model: MODEL, rank: 8, seed: 42 };
  cached = {
    'sft-round': {
      ...common,
      max_seq_len: 1024,
      train,
      eval: data(EVAL_TICKETS),
      epochs: 2,
      batch_size: 8,
      learning_rate: 4e-5,
      sample_prompts: EVAL_TICKETS.map(([t]) => tok.encode(prompt(t))),
      max_tokens: 4,
    },
    'rl-step': {
      ...common,
      prompts: TICKETS.slice(0, 2).map(([t]) => tok.encode(prompt(t))),
      group_size: 4,
      max_tokens: 6,
      steps: 2,
      loss_fn: 'importance_sampling',
      learning_rate: 1e-4,
    },
    'rl-guide-step': {
      ...common,
      prompts: TICKETS.slice(0, 2).map(([t]) => tok.encode(prompt(t))),
      group_size: 4,
      max_tokens: 6,
      steps: 1,
      loss_fn: 'ppo',
      learning_rate: 1e-4,
    },
    'deploy-chat': {
      ...common,
      train: train.slice(0, 4),
      steps: 2,
      learning_rate: 1e-3,
      name: 'step-2',
      model_name: 'conformance-deploy',
      messages: [{ role: 'user', content: TICKETS[0]![0] }],
      max_tokens: 6,
    },
    resume: { ...common, train: train.slice(0, 4), learning_rate: 1e-4 },
    cleanup: { ...common, train: train.slice(0, 2), bad_path: 'bt://loops:nosuchrun/weights/missing' },
  };
  return cached;
}
