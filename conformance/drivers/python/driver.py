"""The conformance driver for the reference client: maps each task onto loops_client.

Reads LOOPS_CONFORMANCE_TASK and the JSON in LOOPS_CONFORMANCE_INPUT, talks to the server
at LOOPS_BASE_URL (default https://api.baseten.co; control plane at BASETEN_MANAGEMENT_API_URL_OVERRIDE) with
BASETEN_API_KEY, and writes its result to LOOPS_CONFORMANCE_OUTPUT:

    {"task": ..., "status": "ok" | "error", "error": {"class", "message"}?, "runs": [...], ...}

Usage: python3 driver.py [--broken NAME ...]   (NAMEs: see BROKEN_VARIANTS)
"""

import contextlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loops_client  # noqa: E402
from loops_client import OperationError, ServiceClient  # noqa: E402

BROKEN_VARIANTS = {
    "no-408-retry": "gives up on the first sampler 408 instead of backing off",
    "forget-idempotency-key": "resubmits a lost operation with a new Idempotency-Key",
    "no-idempotency-key": "sends trainer submissions without an Idempotency-Key",
    "ignore-floor": "never sends X-Min-Policy-Version and uses whatever version answers",
    "skip-cleanup-on-failure": "leaves its runs active when the task fails",
    "poll-forever-on-user-error": "resubmits an operation that failed with a user error, without end",
    "shifted-logprobs": "puts each sampler logprob of the RL guide's datum one position early (next-token alignment)",
    "deploy-by-name-only": "matches the checkpoint by name alone and deploys the trainer checkpoint of that name",
    "chat-before-active": "calls the deployed model at once, without waiting for ACTIVE, and gives up on its 503",
}


def sft_round(svc, inp, out):
    """campaign.py: capabilities, trainer, baseline eval, epochs of forward_backward + optim_step, eval, saves, samples."""
    caps = svc.capabilities()
    names = [m.get("name") for m in caps.get("base_models", caps.get("models", []))] if isinstance(caps, dict) else []
    if names and inp["model"] not in names:
        raise RuntimeError(f"{inp['model']} is not offered: {names}")
    with task_session(svc, out) as session:
        trainer = svc.create_training_client(session, inp["model"], inp["rank"], seed=inp["seed"], max_seq_len=inp["max_seq_len"], name="conformance-sft")
        baseline = trainer.forward(inp["eval"])["loss"]
        for _ in range(inp["epochs"]):
            for start in range(0, len(inp["train"]), inp["batch_size"]):
                trainer.forward_backward(inp["train"][start:start + inp["batch_size"]])
                trainer.optim_step(inp["learning_rate"])
                out["optim_steps"] = out.get("optim_steps", 0) + 1
        final = trainer.forward(inp["eval"])["loss"]
        out["losses"] = {"baseline": baseline, "final": final}
        out["state_path"] = trainer.save_state("final")
        sampler = trainer.save_weights_for_sampler("final")
        out["samples"] = []
        for prompt in inp["sample_prompts"]:
            res = sampler.sample(prompt, num_samples=1, max_tokens=inp["max_tokens"], temperature=0)
            out["samples"].append({"policy_version": res["policy_version"], "tokens": res["sequences"][0]["tokens"]})


def rl_step(svc, inp, out):
    """rl_loop.py: publish, version-pinned group sampling, ratio-loss forward_backward, optim_step, publish, sample again."""
    with task_session(svc, out) as session:
        trainer = svc.create_training_client(session, inp["model"], inp["rank"], seed=inp["seed"], name="conformance-rl")
        out["samples_used"] = []
        sampler = trainer.save_weights_for_sampler("v0")
        for step in range(inp["steps"]):
            data = []
            for p, prompt in enumerate(inp["prompts"]):
                sampler.affinity_key = f"prompt-{p}"
                res = sampler.sample(prompt, num_samples=inp["group_size"], max_tokens=inp["max_tokens"], temperature=1.0, top_p=0.95, seed=step * 100 + p)
                seqs = res["sequences"]
                out["samples_used"].append({"policy_version": res["policy_version"], "floor": sampler.min_version})
                rewards = [reward(s["tokens"]) for s in seqs]
                mean = sum(rewards) / len(rewards)
                for s, r in zip(seqs, rewards):
                    data.append(rl_datum(prompt, s["tokens"], s["logprobs"], r - mean))
            trainer.forward_backward(data, loss_fn=inp["loss_fn"])
            trainer.optim_step(inp["learning_rate"])
            out["optim_steps"] = out.get("optim_steps", 0) + 1
            # The next rollouts must come from the new weights: publish and pin to the new version.
            sampler = trainer.save_weights_for_sampler(f"v{step + 1}")
        final = sampler.sample(inp["prompts"][0], num_samples=1, max_tokens=inp["max_tokens"], temperature=0)
        out["final_policy_version"] = final["policy_version"]


def rl_guide_step(svc, inp, out):
    """The RL guide's step: token-aligned datums without target_tokens, a ppo forward_backward, optim_step, publish, sample."""
    with task_session(svc, out) as session:
        trainer = svc.create_training_client(session, inp["model"], inp["rank"], seed=inp["seed"], name="conformance-rl-guide")
        sampler = trainer.save_weights_for_sampler("v0")
        out["divergence"] = []
        for step in range(inp["steps"]):
            data = []
            for p, prompt in enumerate(inp["prompts"]):
                res = sampler.sample(prompt, num_samples=inp["group_size"], max_tokens=inp["max_tokens"], temperature=1.0, seed=step * 100 + p)
                seqs = res["sequences"]
                rewards = [reward(s["tokens"]) for s in seqs]
                mean = sum(rewards) / len(rewards)
                for s, r in zip(seqs, rewards):
                    data.append(guide_datum(prompt, s["tokens"], s["logprobs"], r - mean))
            result = trainer.forward_backward(data, loss_fn=inp["loss_fn"])
            metrics = result.get("metrics", {})
            out["divergence"].append({k: metrics.get(k) for k in ("ratio_mean", "kl_sampler_trainer")})
            trainer.optim_step(inp["learning_rate"])
            out["optim_steps"] = out.get("optim_steps", 0) + 1
            sampler = trainer.save_weights_for_sampler(f"v{step + 1}")
        final = sampler.sample(inp["prompts"][0], num_samples=1, max_tokens=inp["max_tokens"], temperature=0)
        out["final_policy_version"] = final["policy_version"]


def guide_datum(prompt, completion, logprobs, advantage):
    """As the RL guide builds it: prompt + completion, no target_tokens; logprobs and advantages at each completion token's own index."""
    tokens = prompt + completion
    n = len(tokens)
    lp = [0.0] * len(prompt) + list(logprobs)
    adv = [0.0] * len(prompt) + [advantage] * len(completion)
    if "shifted-logprobs" in loops_client.BROKEN:
        lp = lp[1:] + [0.0]
        adv = adv[1:] + [0.0]
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
        "loss_fn_inputs": {
            "logprobs": {"data": lp, "dtype": "float32", "shape": [n]},
            "advantages": {"data": adv, "dtype": "float32", "shape": [n]},
        },
    }


def deploy_chat(svc, inp, out):
    """Every guide's last step: train, save for the sampler, deploy that checkpoint by name, wait for ACTIVE, chat with it, tear it down."""
    with task_session(svc, out) as session:
        trainer = svc.create_training_client(session, inp["model"], inp["rank"], seed=inp["seed"], name="conformance-deploy")
        for _ in range(inp["steps"]):
            trainer.forward_backward(inp["train"])
            trainer.optim_step(inp["learning_rate"])
            out["optim_steps"] = out.get("optim_steps", 0) + 1
        # A trainer and a sampler checkpoint of the same name: only the sampler one is deployable.
        trainer.save_state(inp["name"])
        trainer.save_weights_for_sampler(inp["name"])
        named = [c for c in svc.list_checkpoints(trainer.run_id) if c["checkpoint_id"] == inp["name"]]
        if "deploy-by-name-only" in loops_client.BROKEN:
            # Matching on the name alone lands on either; the broken variant takes the trainer one, deterministically.
            chosen = next(c for c in named if c["target"] == "trainer")
        else:
            chosen = next(c for c in named if c["target"] == "sampler")
        deployed = svc.deploy_checkpoints([chosen["id"]], inp["model_name"])
        mid, did = deployed["model_id"], deployed["deployment_id"]
        out["deployment"] = {"model_id": mid, "deployment_id": did}
        try:
            if "chat-before-active" not in loops_client.BROKEN:
                svc.wait_model_active(mid, did)
            reply = svc.chat(mid, did, inp["name"], inp["messages"], max_tokens=inp["max_tokens"], temperature=0)
            out["answer"] = reply["choices"][0]["message"]["content"]
            out["usage"] = reply.get("usage")
        finally:
            svc.deactivate_model(mid, did)


def reward(tokens):
    """A toy reward with spread inside a group: the share of even token ids in the completion."""
    return sum(1.0 for t in tokens if t % 2 == 0) / max(len(tokens), 1)


def rl_datum(prompt, completion, logprobs, advantage):
    """Explicit target_tokens aligned with logprobs and advantages; prompt positions carry 0.0."""
    tokens = prompt + completion[:-1]
    targets = prompt[1:] + completion
    n = len(tokens)
    lp = [0.0] * (len(prompt) - 1) + list(logprobs)
    adv = [0.0] * (len(prompt) - 1) + [advantage] * len(completion)
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": targets, "dtype": "int64", "shape": [n]},
            "logprobs": {"data": lp, "dtype": "float32", "shape": [n]},
            "advantages": {"data": adv, "dtype": "float32", "shape": [n]},
        },
    }


def resume(svc, inp, out):
    """save_state, a new trainer from that state with its optimizer, continue."""
    with task_session(svc, out) as session:
        first = svc.create_training_client(session, inp["model"], inp["rank"], seed=inp["seed"], name="conformance-resume-1")
        first.forward_backward(inp["train"])
        first.optim_step(inp["learning_rate"])
        path = first.save_state("mid")
        svc.deactivate_run(first.run_id)
        second = svc.create_training_client(session, inp["model"], inp["rank"], seed=inp["seed"], name="conformance-resume-2")
        second.load_state_with_optimizer(path)
        second.forward_backward(inp["train"])
        second.optim_step(inp["learning_rate"])
        out["optim_steps"] = 2
        out["policy_version"] = second.policy_version()


def cleanup_task(svc, inp, out):
    """Fails midway (a bad checkpoint path) and must still deactivate what it created."""
    with task_session(svc, out) as session:
        trainer = svc.create_training_client(session, inp["model"], inp["rank"], name="conformance-cleanup")
        trainer.forward_backward(inp["train"])
        trainer.load_state_with_optimizer(inp["bad_path"])


@contextlib.contextmanager
def task_session(svc, out):
    """A session for the task; however the task ends, the runs it created are deactivated."""
    session = svc.create_session()
    out["session_id"] = session
    try:
        yield session
    finally:
        out["runs"] = list(svc.created_runs)
        failing = sys.exc_info()[0] is not None
        if not (failing and "skip-cleanup-on-failure" in loops_client.BROKEN):
            svc.cleanup(session)


TASKS = {"sft-round": sft_round, "rl-step": rl_step, "rl-guide-step": rl_guide_step, "deploy-chat": deploy_chat, "resume": resume, "cleanup": cleanup_task}


def main(argv):
    args = list(argv)
    while "--broken" in args:
        i = args.index("--broken")
        name = args[i + 1]
        if name not in BROKEN_VARIANTS:
            sys.exit(f"unknown --broken {name}; known: {', '.join(BROKEN_VARIANTS)}")
        loops_client.BROKEN.add(name)
        del args[i:i + 2]
    task = os.environ["LOOPS_CONFORMANCE_TASK"]
    with open(os.environ["LOOPS_CONFORMANCE_INPUT"]) as f:
        inp = json.load(f)
    # Unset, the root is Baseten's own, as in the SDK (a client behind loops-mock's proxy leaves it so).
    svc = ServiceClient(os.environ.get("LOOPS_BASE_URL", "https://api.baseten.co"), os.environ["BASETEN_API_KEY"], os.environ.get("BASETEN_MANAGEMENT_API_URL_OVERRIDE"))
    out = {"task": task, "status": "ok", "runs": []}
    code = 0
    try:
        TASKS[task](svc, inp, out)
    except OperationError as err:
        out["status"] = "error"
        out["error"] = {"class": err.error_class, "message": str(err)}
        code = 1
    except Exception as err:  # noqa: BLE001 - every failure is reported in the output
        out["status"] = "error"
        out["error"] = {"class": type(err).__name__, "message": str(err)}
        traceback.print_exc()
        code = 1
    with open(os.environ["LOOPS_CONFORMANCE_OUTPUT"], "w") as f:
        json.dump(out, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
