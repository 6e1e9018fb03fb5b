#!/usr/bin/env bash
# The steps of action.yml (the loops-mock GitHub Action): `start` runs loops-mock serve in the background
# for the rest of the job and writes its client variables to $GITHUB_ENV; `stop` stops it gracefully.
# Inputs come as LM_* variables (action.yml maps them); plain bash, so the tests run it as a runner would.
set -euo pipefail

start() {
  local temp="${RUNNER_TEMP:-${TMPDIR:-/tmp}}"
  local log="${LM_LOG_FILE:-$temp/loops-mock.log}"
  local env_file="$temp/loops-mock.env"
  local -a cmd
  if [ -n "${LM_COMMAND:-}" ]; then
    read -r -a cmd <<< "$LM_COMMAND"
  elif [ -x node_modules/.bin/loops-mock ]; then
    cmd=(node_modules/.bin/loops-mock)
  else
    local prefix="$temp/loops-mock-install"
    echo "Installing loops-mock@${LM_VERSION:-latest} into $prefix"
    # The environment variable, not npm's deprecated --onnxruntime-node-install: no CUDA download.
    ONNXRUNTIME_NODE_INSTALL=skip npm install --prefix "$prefix" --no-save --no-audit --no-fund "loops-mock@${LM_VERSION:-latest}"
    cmd=("$prefix/node_modules/.bin/loops-mock")
  fi
  local -a flags=(serve --port "${LM_PORT:-8787}" --write-env "$env_file" --log-format json)
  if [ "${LM_PROXY:-false}" = "true" ]; then flags+=(--proxy); fi
  local -a extra=()
  if [ -n "${LM_ARGS:-}" ]; then read -r -a extra <<< "$LM_ARGS"; fi
  rm -f "$env_file"
  # In the background, output to the log, no terminal: the step ends, the server stays for the job's later steps.
  nohup "${cmd[@]}" "${flags[@]}" "${extra[@]}" < /dev/null > "$log" 2>&1 &
  local pid=$!
  local deadline=$(( $(date +%s) + ${LM_WAIT_SECONDS:-60} ))
  # --write-env writes the file once the server listens; then /healthz must answer.
  until [ -s "$env_file" ]; do
    if ! kill -0 "$pid" 2> /dev/null; then
      echo "::error::loops-mock exited before it was listening; its log:"; cat "$log"; exit 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "::error::loops-mock was not listening within ${LM_WAIT_SECONDS:-60} s; its log:"; cat "$log"; kill "$pid" 2> /dev/null || true; exit 1
    fi
    sleep 0.2
  done
  local url
  url="$(sed -n 's/^LOOPS_BASE_URL=//p; s/^HTTPS_PROXY=//p' "$env_file" | head -n 1)"
  until curl -fsS "$url/healthz" > /dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "::error::loops-mock's $url/healthz did not answer within ${LM_WAIT_SECONDS:-60} s; its log:"; cat "$log"; kill "$pid" 2> /dev/null || true; exit 1
    fi
    sleep 0.2
  done
  cat "$env_file" >> "$GITHUB_ENV"
  { echo "LOOPS_MOCK_PID=$pid"; echo "LOOPS_MOCK_LOG=$log"; } >> "$GITHUB_ENV"
  echo "pid=$pid" >> "${GITHUB_STATE:-/dev/null}"
  { echo "url=$url"; echo "pid=$pid"; echo "log=$log"; } >> "${GITHUB_OUTPUT:-/dev/null}"
  echo "loops-mock (pid $pid) listening on $url; its variables are in the environment of the following steps:"
  sed 's/^BASETEN_API_KEY=.*/BASETEN_API_KEY=***/' "$env_file"
}

stop() {
  local pid="${LOOPS_MOCK_PID:-}"
  if [ -z "$pid" ]; then echo "No loops-mock was started in this job (LOOPS_MOCK_PID is not set)"; return 0; fi
  if ! kill -0 "$pid" 2> /dev/null; then echo "loops-mock (pid $pid) has already stopped"; return 0; fi
  # SIGTERM: requests in flight finish, state is flushed, exit 0; SIGKILL only if it lingers.
  kill -TERM "$pid"
  local deadline=$(( $(date +%s) + ${LM_WAIT_SECONDS:-60} ))
  while kill -0 "$pid" 2> /dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "::warning::loops-mock (pid $pid) did not stop on SIGTERM; killing it"; kill -KILL "$pid" 2> /dev/null || true; return 0; fi
    sleep 0.2
  done
  echo "loops-mock (pid $pid) stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
