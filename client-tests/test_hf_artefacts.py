"""The tiny base model and every checkpoint as real Hugging Face artefacts: transformers and
PEFT, loading them as a user would (the base model from the Hub mirror, adapters from the
checkpoints' presigned URLs), compute the mock's own numbers."""

import json
import os

import pytest
import requests

TOLERANCE = 1e-4
MODEL = "Qwen/Qwen3.5-2B"

# Runs in a child Python with HF_ENDPOINT (or the proxy variables) only: loads the base model
# from the Hub, optionally an adapter folder through PEFT, and reports logprobs and greedy tokens.
SCORE = """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    job = json.load(open(JOB))
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    if job.get("adapter"):
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, job["adapter"])
    model.eval()

    def scores(m):
        out = []
        with torch.no_grad():
            for tokens in job["sequences"]:
                lp = torch.log_softmax(m(torch.tensor([tokens])).logits[0].float(), -1)
                out.append([lp[i, tokens[i + 1]].item() for i in range(len(tokens) - 1)])
        return out

    result = {"logprobs": scores(model), "config": model.config.to_dict()["architectures"]}
    if job.get("generate"):
        result["greedy"] = []
        with torch.no_grad():
            for prompt in job["generate"]:
                ids = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
                result["greedy"].append(ids[0, len(prompt):].tolist())
    if job.get("merge"):
        result["merged"] = scores(model.merge_and_unload())
    print(json.dumps(result))
"""


class Loops:
    """A small client of the mock's control and trainer planes, as a test would write one with requests."""

    def __init__(self, url, key="hf-artefacts"):
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}"}

    def post(self, url, body=None, headers=None):
        r = requests.post(url, json=body, headers={**self.headers, **(headers or {})}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    def op(self, trainer, name, body):
        operation = self.post(f"{trainer}/{name}", body)["operation_id"]
        while True:
            r = requests.get(f"{trainer}/operations/{operation}", headers=self.headers, timeout=60)
            if r.status_code == 408:
                continue
            answer = r.json()
            assert answer["status"] == "done", answer
            return answer["result"]

    def run(self, rank):
        session = self.post(f"{self.url}/v1/loops/sessions")["session"]["id"]
        return self.post(f"{self.url}/v1/loops/runs", {"session_id": session, "base_model": MODEL, "lora_rank": rank, "max_seq_len": 256, "seed": 7})["run"]

    def download(self, path, folder):
        checkpoints = requests.get(f"{self.url}/v1/loops/checkpoints", params={"checkpoint_path": path}, headers=self.headers, timeout=60).json()["checkpoints"]
        files = requests.get(f"{self.url}/v1/loops/checkpoints/{checkpoints[0]['id']}/files", headers=self.headers, timeout=60).json()["presigned_urls"]
        os.makedirs(folder, exist_ok=True)
        for f in files:
            with open(os.path.join(folder, f["relative_file_name"]), "wb") as out:
                out.write(requests.get(f["url"], timeout=60).content)
        return sorted(f["relative_file_name"] for f in files)


def sequences_of(data):
    return [d["model_input"]["chunks"][0]["tokens"] for d in data]


def mock_forward(loops, trainer, sequences):
    """The mock's logprob of each next token (no target_tokens: position i scores token i+1; the last slot is 0)."""
    result = loops.op(trainer, "forward", {"data": [{"model_input": {"chunks": [{"type": "encoded_text", "tokens": t}]}} for t in sequences], "loss_fn": "cross_entropy"})
    return [o["logprobs"]["data"][:-1] for o in result["loss_fn_outputs"]]


def max_diff(a, b):
    assert [len(x) for x in a] == [len(x) for x in b]
    return max(abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


def train(loops, trainer, data, steps=10):
    for _ in range(steps):
        loops.op(trainer, "forward_backward", {"data": data, "loss_fn": "cross_entropy"})
        loops.op(trainer, "optim_step", {"adam_params": {"learning_rate": 1e-2}})


@pytest.fixture(scope="module")
def sft(mock):
    with open(mock["sft_input"]) as f:
        return json.load(f)


@pytest.fixture
def score(run_client, tmp_path, endpoint_env):
    def go(job, env=None):
        path = tmp_path / "job.json"
        path.write_text(json.dumps({"model": MODEL, **job}))
        out, _ = run_client(SCORE.replace("JOB", repr(str(path))), env or endpoint_env)
        return out
    return go


def test_the_base_model_from_the_hub_computes_the_mocks_logprobs(mock, sft, score):
    loops = Loops(mock["direct_env"]["LOOPS_BASE_URL"])
    run = loops.run(8)
    sequences = sequences_of(sft["train"] + sft["eval"])
    expected = mock_forward(loops, run["base_url"], sequences)
    out = score({"sequences": sequences})
    assert out["config"] == ["LlamaForCausalLM"]
    assert max_diff(out["logprobs"], expected) < TOLERANCE


def test_the_base_model_loads_through_the_proxy_too(mock, sft, score, proxy_env):
    loops = Loops(mock["direct_env"]["LOOPS_BASE_URL"])
    run = loops.run(8)
    sequences = sequences_of(sft["eval"])
    out = score({"sequences": sequences}, env=proxy_env)
    assert max_diff(out["logprobs"], mock_forward(loops, run["base_url"], sequences)) < TOLERANCE


def test_a_trained_sampler_checkpoint_loads_in_peft_and_agrees_with_trainer_sampler_and_greedy_sampling(mock, sft, score, tmp_path):
    loops = Loops(mock["direct_env"]["LOOPS_BASE_URL"])
    run = loops.run(16)
    trainer, sampler = run["base_url"], run["sampler"]["base_url"]
    train(loops, trainer, sft["train"])
    saved = loops.op(trainer, "save_weights_for_sampler", {"name": "peft-check"})
    assert saved["policy_version"] == 10
    files = loops.download(saved["path"], str(tmp_path / "sampler-ckpt"))
    assert files == ["adapter_config.json", "adapter_model.safetensors"]
    sequences = sequences_of(sft["train"] + sft["eval"])
    trainer_lp = mock_forward(loops, trainer, sequences)
    floor = {"X-Min-Policy-Version": "10"}
    sampler_lp = [loops.post(f"{sampler}/compute_logprobs", {"prompt": {"chunks": [{"type": "encoded_text", "tokens": t}]}}, floor)["logprobs"][1:] for t in sequences]
    greedy = []
    for prompt in sft["sample_prompts"]:
        answer = loops.post(f"{sampler}/sample", {"prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]}, "sampling_params": {"max_tokens": 16, "temperature": 0}}, floor)
        assert answer["policy_version"] == 10
        greedy.append(answer["sequences"][0]["tokens"])

    out = score({"sequences": sequences, "adapter": str(tmp_path / "sampler-ckpt"), "generate": sft["sample_prompts"], "merge": True})
    assert max_diff(out["logprobs"], trainer_lp) < TOLERANCE
    assert max_diff(out["logprobs"], sampler_lp) < TOLERANCE
    assert max_diff(out["merged"], trainer_lp) < TOLERANCE
    assert out["greedy"] == greedy
    # The training moved the weights: the comparison is not of two untouched base models.
    base = score({"sequences": sequences})
    assert max_diff(base["logprobs"], trainer_lp) > 0.1


def test_the_adapter_inside_a_save_state_checkpoint_loads_the_same_way(mock, sft, score, tmp_path):
    loops = Loops(mock["direct_env"]["LOOPS_BASE_URL"])
    run = loops.run(8)
    train(loops, run["base_url"], sft["train"][:4], steps=3)
    saved = loops.op(run["base_url"], "save_state", {"name": "state-check"})
    files = loops.download(saved["path"], str(tmp_path / "state-ckpt"))
    assert files == ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json"]
    sequences = sequences_of(sft["eval"])
    out = score({"sequences": sequences, "adapter": str(tmp_path / "state-ckpt")})
    assert max_diff(out["logprobs"], mock_forward(loops, run["base_url"], sequences)) < TOLERANCE


@pytest.mark.parametrize("case", ["rank 64, above the unembedding cap", "--unembedding-rank 16"])
def test_capped_and_uncapped_unembedding_ranks_load_and_agree(mock, sft, score, tmp_path, case):
    if case == "--unembedding-rank 16":
        loops, rank, lm_head_rank = Loops(mock["uncapped_url"]), 16, 16
    else:
        loops, rank, lm_head_rank = Loops(mock["direct_env"]["LOOPS_BASE_URL"]), 64, 4
    run = loops.run(rank)
    train(loops, run["base_url"], sft["train"][:4], steps=3)
    saved = loops.op(run["base_url"], "save_weights_for_sampler", {"name": "rank-check"})
    folder = tmp_path / "ckpt"
    loops.download(saved["path"], str(folder))
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == rank
    assert config["rank_pattern"].get("lm_head", rank) == lm_head_rank
    sequences = sequences_of(sft["eval"])
    out = score({"sequences": sequences, "adapter": str(folder)})
    assert max_diff(out["logprobs"], mock_forward(loops, run["base_url"], sequences)) < TOLERANCE
