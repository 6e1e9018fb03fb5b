"""A small Loops client on the Python standard library, following the documented SDK behaviour.

It doubles as runnable documentation of the protocol (docs/protocol.md): every rule a client
must follow is written where it applies, with a comment saying why.

`BROKEN` holds names of deliberate protocol violations, set by the driver's --broken
flag, so the conformance suite can prove that its checks catch them.
"""

import http.client
import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

BROKEN = set()


class LoopsError(Exception):
    """An answer the client cannot use: status and the server's error body."""

    def __init__(self, status, body, what):
        self.status = status
        self.body = body
        error = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"{what}: HTTP {status} {error.get('type', '')}: {error.get('message', body)}")


class OperationError(Exception):
    """An operation that ended with status error: a user error, raised with the server's class name."""

    def __init__(self, error_class, message):
        self.error_class = error_class
        super().__init__(f"{error_class}: {message}")


class ConnectionLost(Exception):
    """The connection closed before an answer came: the request may or may not have been handled."""


class Http:
    """JSON over HTTP with the API key on every request (never a request without it)."""

    def __init__(self, api_key, timeout=60.0):
        self.api_key = api_key
        self.timeout = timeout

    def call(self, method, url, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.api_key}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                return res.status, dict(res.headers), _json(res.read())
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), _json(err.read())
        except (urllib.error.URLError, http.client.RemoteDisconnected, ConnectionError, http.client.IncompleteRead) as err:
            raise ConnectionLost(str(err)) from err

    def call_retrying(self, method, url, body=None, headers=None, what="request", attempts=30):
        """Retries what is safe to retry: 429 and 502/503/504 after Retry-After, a lost connection after a backoff.

        Callers make every retried request idempotent (trainer submissions carry the same
        Idempotency-Key on each attempt).
        """
        delay = 0.1
        for attempt in range(attempts):
            try:
                status, hdrs, body_out = self.call(method, url, body, headers)
            except ConnectionLost:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if status in (429, 502, 503, 504) and attempt < attempts - 1:
                time.sleep(retry_after(hdrs, delay))
                delay = min(delay * 2, 2.0)
                continue
            return status, hdrs, body_out
        raise LoopsError(0, {}, f"{what}: no answer after {attempts} attempts")


def _json(raw):
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw.decode(errors="replace")}


def retry_after(headers, default):
    for k, v in headers.items():
        if k.lower() == "retry-after":
            try:
                return max(float(v), 0.0)
            except ValueError:
                pass
    return default


class ServiceClient:
    """The control plane: capabilities, sessions, runs and their cleanup."""

    def __init__(self, base_url, api_key, management_url=None):
        self.base_url = base_url.rstrip("/")
        self.management_url = (management_url or base_url).rstrip("/")
        self.http = Http(api_key)
        self.created_runs = []

    def _control(self, method, path, body=None):
        status, _, out = self.http.call_retrying(method, f"{self.management_url}/v1/loops{path}", body, what=f"{method} {path}")
        if status != 200:
            raise LoopsError(status, out, f"{method} {path}")
        return out

    def capabilities(self):
        return self._control("GET", "/capabilities")

    def create_session(self):
        return self._control("POST", "/sessions")["session"]["id"]

    def create_training_client(self, session_id, base_model, rank, seed=None, max_seq_len=None, name=None, ready_timeout=120.0):
        body = {"session_id": session_id, "base_model": base_model, "lora_rank": rank}
        if seed is not None:
            body["seed"] = seed
        if max_seq_len is not None:
            body["max_seq_len"] = max_seq_len
        if name is not None:
            body["name"] = name
        # POST /runs is not idempotent: a lost answer could leave a run behind, so it is not
        # retried on a lost connection; 429/503 answers mean nothing was created.
        status, _, out = self.http.call_retrying("POST", f"{self.management_url}/v1/loops/runs", body, what="POST /runs")
        if status != 200:
            raise LoopsError(status, out, "POST /runs")
        run = out["run"]
        self.created_runs.append(run["id"])
        client = TrainingClient(self.http, run)
        client.wait_ready(ready_timeout)
        return client

    def list_runs(self):
        return self._control("GET", "/runs")["runs"]

    def deactivate_run(self, run_id):
        return self._control("POST", f"/runs/{run_id}/deactivate")

    def list_checkpoints(self, run_id):
        return self._control("GET", f"/checkpoints?run_id={run_id}")["checkpoints"]

    def deploy_checkpoints(self, checkpoint_ids, model_name):
        """POST /checkpoints/deploy: sampler-target checkpoints, by their global id; answers model_id and deployment_id."""
        return self._control("POST", "/checkpoints/deploy", {"checkpoint_ids": checkpoint_ids, "model_name": model_name})

    def _model_deployment(self, model_id, deployment_id, suffix="", method="GET"):
        url = f"{self.management_url}/v1/models/{model_id}/deployments/{deployment_id}{suffix}"
        status, _, out = self.http.call_retrying(method, url, what=f"{method} /v1/models/{model_id}/deployments/{deployment_id}{suffix}")
        if status != 200:
            raise LoopsError(status, out, f"{method} model deployment {deployment_id}{suffix}")
        return out

    def wait_model_active(self, model_id, deployment_id, timeout=120.0):
        """Polls the model deployment's top-level status until ACTIVE (BUILDING, DEPLOYING, LOADING_MODEL before it)."""
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            status = self._model_deployment(model_id, deployment_id).get("status")
            if status == "ACTIVE":
                return
            if status not in ("BUILDING", "DEPLOYING", "LOADING_MODEL", "UPDATING", "WAKING_UP"):
                raise RuntimeError(f"deployment {deployment_id} is {status}, not coming up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"deployment {deployment_id} not ACTIVE within {timeout} s (last: {status})")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def deactivate_model(self, model_id, deployment_id):
        return self._model_deployment(model_id, deployment_id, "/deactivate", "POST")

    def inference_url(self, model_id, deployment_id):
        """Where a deployed model answers: Baseten's own host, or the base URL's server when one is given."""
        if self.base_url.rstrip("/") == "https://api.baseten.co":
            return f"https://model-{model_id}.api.baseten.co/deployment/{deployment_id}/sync/v1"
        return f"{self.base_url}/model/{model_id}/deployment/{deployment_id}/sync/v1"

    def chat(self, model_id, deployment_id, model, messages, **params):
        """OpenAI-compatible chat completions on the deployed model; a 503 (still loading) is retried after Retry-After."""
        url = f"{self.inference_url(model_id, deployment_id)}/chat/completions"
        body = {"model": model, "messages": messages, **params}
        if "chat-before-active" in BROKEN:
            status, _, out = self.http.call("POST", url, body)
        else:
            status, _, out = self.http.call_retrying("POST", url, body, what="chat/completions")
        if status != 200:
            raise LoopsError(status, out if isinstance(out, dict) else {}, "chat/completions")
        return out

    def cleanup(self, session_id):
        """Deactivates every run of the session that is still active (campaign.py's cleanup)."""
        for run in self.list_runs():
            status = run.get("status", {})
            name = status.get("name") if isinstance(status, dict) else status
            if run.get("session_id") == session_id and name != "INACTIVE":
                self.deactivate_run(run["id"])


class Operation:
    """A submitted operation: its kind, body and idempotency key, kept for resubmission."""

    def __init__(self, op, body, key, operation_id):
        self.op = op
        self.body = body
        self.key = key
        self.operation_id = operation_id


class TrainingClient:
    """One run's trainer: submit-then-poll operations (docs/protocol.md, the trainer data plane)."""

    def __init__(self, http_, run):
        self.http = http_
        self.run = run
        self.run_id = run["id"]
        self.trainer_url = run["base_url"].rstrip("/")
        sampler = run.get("sampler") or {}
        self.sampler_url = (sampler.get("base_url") or "").rstrip("/") or None
        self.published_version = None

    def wait_ready(self, timeout):
        """Polls /health until 200; 503 means still starting (wait Retry-After)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, hdrs, out = self.http.call("GET", f"{self.trainer_url}/health")
            except ConnectionLost:
                status, hdrs, out = 0, {}, None
            if status == 200:
                return
            if status not in (0, 429, 502, 503, 504):
                raise LoopsError(status, out, "trainer health")
            if time.monotonic() > deadline:
                raise LoopsError(status, out, "trainer not ready in time")
            time.sleep(min(retry_after(hdrs, 0.2), 1.0))

    def submit(self, op, body, key=None):
        """POST {trainer}/<op> with an Idempotency-Key, the same on every retry, so nothing runs twice.

        A lost connection may have lost only the answer (the operation was queued): the retry
        with the same key gets that operation back instead of queuing a second one.
        """
        key = key or uuid.uuid4().hex
        delay = 0.1
        for _ in range(30):
            headers = {} if "no-idempotency-key" in BROKEN else {"Idempotency-Key": key}
            try:
                status, hdrs, out = self.http.call("POST", f"{self.trainer_url}/{op}", body, headers)
            except ConnectionLost:
                if "forget-idempotency-key" in BROKEN:
                    key = uuid.uuid4().hex
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if status in (429, 502, 503, 504):
                time.sleep(retry_after(hdrs, delay))
                delay = min(delay * 2, 2.0)
                continue
            if status != 200:
                raise LoopsError(status, out, f"submit {op}")
            return Operation(op, body, key, out["operation_id"])
        raise LoopsError(0, {}, f"submit {op}: no answer after 30 attempts")

    def result(self, operation, timeout=600.0):
        """Long-polls until done. 408: poll again at once. 404 (lost): resubmit with the same key.

        503 (shutting down): wait, then poll again; a lost connection: poll again.
        """
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise LoopsError(408, {}, f"{operation.op} not done in {timeout}s")
            try:
                status, hdrs, out = self.http.call("GET", f"{self.trainer_url}/operations/{operation.operation_id}")
            except ConnectionLost:
                continue
            if status == 408:
                continue
            if status == 404:
                # The trainer lost it (restart) or its result expired: the same key gives the same operation back.
                key = uuid.uuid4().hex if "forget-idempotency-key" in BROKEN else operation.key
                operation.operation_id = self.submit(operation.op, operation.body, key).operation_id
                operation.key = key
                continue
            if status in (429, 502, 503, 504):
                time.sleep(retry_after(hdrs, 0.5))
                continue
            if status != 200:
                raise LoopsError(status, out, f"poll {operation.op}")
            if out["status"] == "error":
                err = out["error"]
                if "poll-forever-on-user-error" in BROKEN:
                    # Broken on purpose: treats a user error as transient and tries again without end.
                    operation.operation_id = self.submit(operation.op, operation.body).operation_id
                    continue
                raise OperationError(err["error_class"], err["message"])
            return out["result"]

    def call(self, op, body):
        return self.result(self.submit(op, body))

    def forward(self, data, loss_fn="cross_entropy", loss_fn_config=None):
        return self.call("forward", _pass_body(data, loss_fn, loss_fn_config))

    def forward_backward(self, data, loss_fn="cross_entropy", loss_fn_config=None):
        return self.call("forward_backward", _pass_body(data, loss_fn, loss_fn_config))

    def optim_step(self, learning_rate):
        return self.call("optim_step", {"adam_params": {"learning_rate": learning_rate}})

    def save_state(self, name):
        return self.call("save_state", {"name": name})["path"]

    def load_state_with_optimizer(self, path):
        return self.call("load_state_with_optimizer", {"path": path})

    def save_weights_for_sampler(self, name):
        """Publishes to the paired sampler; returns a sampling client pinned to the published version."""
        out = self.call("save_weights_for_sampler", {"name": name})
        self.published_version = out.get("policy_version")
        return SamplingClient(self.http, self.sampler_url, min_version=self.published_version)

    def policy_version(self):
        status, _, out = self.http.call_retrying("GET", f"{self.trainer_url}/policy_version", what="policy_version")
        if status != 200:
            raise LoopsError(status, out, "policy_version")
        return out["policy_version"]


def _pass_body(data, loss_fn, loss_fn_config):
    body = {"data": data, "loss_fn": loss_fn}
    if loss_fn_config:
        body["loss_fn_config"] = loss_fn_config
    return body


class SamplingClient:
    """A sampler, pinned to a policy version floor: requests below it wait, then 408, and are retried."""

    def __init__(self, http_, sampler_url, min_version=None, affinity_key=None, timeout=120.0):
        self.http = http_
        self.sampler_url = sampler_url
        self.min_version = min_version
        self.affinity_key = affinity_key
        self.timeout = timeout

    def sample(self, tokens, num_samples=1, **params):
        body = {"prompt": {"chunks": [{"type": "encoded_text", "tokens": tokens}]}, "num_samples": num_samples, "sampling_params": params}
        headers = {}
        if self.min_version is not None and "ignore-floor" not in BROKEN:
            headers["X-Min-Policy-Version"] = str(self.min_version)
        if self.affinity_key:
            headers["X-Affinity-Key"] = self.affinity_key
        deadline = time.monotonic() + self.timeout
        backoff = 0.1
        while True:
            try:
                status, hdrs, out = self.http.call("POST", f"{self.sampler_url}/sample", body, headers)
            except ConnectionLost:
                status, hdrs, out = 0, {}, None
            if status == 200:
                # Never use a sample below the floor, whatever served it.
                if self.min_version is not None and out["policy_version"] < self.min_version and "ignore-floor" not in BROKEN:
                    status = 408
                else:
                    return out
            if status == 408 and "no-408-retry" in BROKEN:
                raise LoopsError(status, out, "sample")
            if status not in (0, 408, 429, 502, 503, 504):
                raise LoopsError(status, out, "sample")
            if time.monotonic() > deadline:
                raise LoopsError(status, out, "sample: floor not reached in time")
            # 408 (replicas below the floor): growing backoff with jitter, bounded; 429/503: Retry-After.
            wait = retry_after(hdrs, backoff) if status in (429, 503) else backoff
            time.sleep(min(wait, 2.0) * (1 + random.random() * 0.1))
            backoff = min(backoff * 2, 1.6)
