"""The TPU VM startup script template (bash); ``shared.domain.startup_script`` fills the ``@@NAME@@`` slots.

Kept as a string constant so it ships with the domain package without package-data configuration and is read
without I/O. Only the values block at the top takes rendered text; everything else is fixed.
"""

TEMPLATE = r"""#!/bin/bash
# tpuctl startup script, rendered from the serving plan by shared/domain/startup_script.py; do not edit on the VM.
# Runs as root on every boot and is safe to run again. Secrets are read from Secret Manager with the VM's own
# service account straight into files on tmpfs (mode 0400): they never enter a shell variable, an argv, a
# container's configured environment, metadata or this log. There is no `set -x` anywhere in this script.
set -Eeuo pipefail
umask 077

# ---- values (rendered; every value is shell-quoted) ----
DEPLOYMENT_ID=@@DEPLOYMENT_ID@@
PLAN_HASH=@@PLAN_HASH@@
IMAGE=@@IMAGE@@
MODEL=@@MODEL@@
MODEL_REVISION=@@MODEL_REVISION@@
HF_TOKEN_SECRET=@@HF_TOKEN_SECRET@@
API_KEY_SECRET=@@API_KEY_SECRET@@
CONTAINER=@@CONTAINER@@
HEALTH_URL=@@HEALTH_URL@@
FIRST_TOKEN_BODY=@@FIRST_TOKEN_BODY@@
SERVING_LISTEN=@@SERVING_LISTEN@@
READY_TIMEOUT_S=@@READY_TIMEOUT_S@@
WEIGHTS_MARKER=@@WEIGHTS_MARKER@@
COMPILE_CACHE_KEY=@@COMPILE_CACHE_KEY@@
COMPILE_CACHE_ROLE=@@COMPILE_CACHE_ROLE@@
NODE_AGENT_BUNDLE=@@NODE_AGENT_BUNDLE@@
NODE_AGENT_BUNDLE_SHA256=@@NODE_AGENT_BUNDLE_SHA256@@
CONTAINER_HF_CACHE=@@CONTAINER_HF_CACHE@@
CONTAINER_VLLM_CACHE=@@CONTAINER_VLLM_CACHE@@
CONTAINER_KEY_DIR=@@CONTAINER_KEY_DIR@@
# shellcheck disable=SC2016  # the wrapper's $-expressions are for the container's /bin/sh, not for this shell
KEY_WRAPPER=@@KEY_WRAPPER@@
KEY_WRAPPER_NAME=@@KEY_WRAPPER_NAME@@
VLLM_ARGV=(
@@VLLM_ARGV@@
)
CONTAINER_ENV=(
@@CONTAINER_ENV@@
)
NODE_AGENT_ENV=(
@@NODE_AGENT_ENV@@
)
WEIGHTS_CACHE_ARGS=(
@@WEIGHTS_CACHE_ARGS@@
)
# ---- end of values ----
readonly DEPLOYMENT_ID PLAN_HASH IMAGE MODEL MODEL_REVISION HF_TOKEN_SECRET API_KEY_SECRET CONTAINER HEALTH_URL
readonly FIRST_TOKEN_BODY SERVING_LISTEN READY_TIMEOUT_S WEIGHTS_MARKER NODE_AGENT_BUNDLE NODE_AGENT_BUNDLE_SHA256
readonly COMPILE_CACHE_KEY COMPILE_CACHE_ROLE
readonly CONTAINER_HF_CACHE CONTAINER_VLLM_CACHE CONTAINER_KEY_DIR KEY_WRAPPER KEY_WRAPPER_NAME VLLM_ARGV CONTAINER_ENV
readonly NODE_AGENT_ENV WEIGHTS_CACHE_ARGS

# Google endpoints: production unless this script's own environment names another with the standard variables
# (google-auth's GCE_METADATA_HOST, gcloud's CLOUDSDK_API_ENDPOINT_OVERRIDES_*, each ending in "/"), which is how a
# local VM twin runs this same script. They are never rendered: no plan or user input can move them.
readonly METADATA_BASE="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
readonly SECRETMANAGER_API="${CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER:-https://secretmanager.googleapis.com/}"
readonly STORAGE_API="${CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE:-https://storage.googleapis.com/storage/v1/}"

# Persistent caches live on the boot disk and are reused after a reboot; secrets live on tmpfs (/run).
readonly STATE_DIR=/var/lib/tpuctl
readonly HF_CACHE="${STATE_DIR}/hf"
readonly VLLM_CACHE="${STATE_DIR}/vllm"
readonly AGENT_DIR="${STATE_DIR}/node-agent"
readonly SECRETS_DIR=/run/tpuctl
readonly SERVING_SECRETS="${SECRETS_DIR}/serving"
readonly DOWNLOAD_SECRETS="${SECRETS_DIR}/download"
readonly BOOT_LOG=/var/log/tpuctl-boot.log
readonly GUEST_ATTRIBUTES="${METADATA_BASE}/instance/guest-attributes/tpuctl"
readonly AGENT_CONTAINER=tpuctl-node-agent
readonly AGENT_DISTRIBUTION=tpuctl-node-agent
readonly DOCKER_SOCKET=/var/run/docker.sock
# vLLM listens on a unix socket only, in a container with no network; the serving proxy (from the node-agent
# bundle) is the only listener on the serving port and the only client of that socket (a root-only directory).
readonly SOCKET_DIR="${SECRETS_DIR}/vllm-socket"
readonly CONTAINER_SOCKET_DIR=/run/tpuctl-vllm
readonly CONTAINER_SOCKET="${CONTAINER_SOCKET_DIR}/vllm.sock"
readonly PROXY_CONTAINER=tpuctl-serving-proxy
readonly PROXY_MODULE=node_agent.serving_proxy
# vLLM binds its socket without removing a stale one: a restarted container (restart policy, serving.restart)
# removes the last one first. "$0" is the socket path; the rest is the key wrapper and the vLLM argv. Beside vLLM
# runs the metrics relay (node_agent/metrics_relay.py, standard library only): libtpu serves its runtime metrics
# on the container's own loopback, and the relay's socket next to vLLM's is how the node agent reads them.
readonly TPU_METRICS_SOCKET="${CONTAINER_SOCKET_DIR}/tpu-metrics.sock"
# shellcheck disable=SC2016  # "$0" and "$@" are for the container's /bin/sh, not for this shell
readonly SOCKET_WRAPPER='rm -f -- "$0" && { python3 /opt/tpuctl/lib/node_agent/metrics_relay.py \
  "${0%/*}/tpu-metrics.sock" @@TPU_METRICS_PORT@@ </dev/null >/dev/null 2>&1 & } && exec "$@"'
log() {
  printf '%s @@LOG_PREFIX@@ deployment=%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${DEPLOYMENT_ID}" "$*" \
    | tee -a "${BOOT_LOG}"
}

# Boot progress for the monitor: a log line (serial console, journal) and guest attributes tpuctl/detail, then
# tpuctl/phase (a reader that sees a phase sees its detail), then once per run tpuctl/boot, when this run began
# (epoch ms): guest attributes outlive a reboot, and the stamp tells this boot's values from an earlier boot's
# (shared/domain/boot_progress.py). Values go on stdin, so a detail starting with @ is never read as a file name.
progress() {
  PROGRESS_PHASE="$1"
  PROGRESS_DETAIL="$2"
  BOOT_STARTED="${BOOT_STARTED:-$(date -u +%s%3N)}"
  log "phase=$1 detail=$2"
  local key value
  for key in detail phase boot; do
    case "${key}" in
      detail) value="$2" ;;
      phase) value="$1" ;;
      *)
        [[ -z "${BOOT_STAMP_SENT:-}" ]] || continue
        value="${BOOT_STARTED}"
        ;;
    esac
    if printf '%s' "${value}" | curl -sf -m 5 -X PUT -H 'Metadata-Flavor: Google' --data-binary @- \
      "${GUEST_ATTRIBUTES}/${key}" >/dev/null 2>&1 && [[ "${key}" == boot ]]; then
      BOOT_STAMP_SENT=1
    fi
  done
}

# uptime_cs: centiseconds on the kernel's clock since boot (/proc/uptime): monotonic, unlike the wall clock that
# NTP may step while the VM boots.
uptime_cs() {
  local up rest
  read -r up rest </proc/uptime
  printf '%s' "$((10#${up/./}))"
}

# stage_done NAME START_CS [EXTRA]: stage NAME ran from START_CS until now. Adds "NAME=SECONDS[,EXTRA]" to this run's
# guest attribute tpuctl/stages ("boot=STAMP;image=84.20;weights=337.00,hub,62579490816;engine=427.90,cold;
# first_token=4.10"), written
# before the phase that follows, so a reader that sees a later phase sees the times of the stages before it
# (shared/domain/boot_stages.py). A failed write is only logged: timing never stops a boot.
stage_done() {
  local took
  took=$(($(uptime_cs) - $2))
  STAGES="${STAGES:-boot=${BOOT_STARTED}};$1=$((took / 100)).$(printf '%02d' $((took % 100)))${3:+,$3}"
  log "stages=${STAGES}"
  printf '%s' "${STAGES}" | curl -sf -m 5 -X PUT -H 'Metadata-Flavor: Google' --data-binary @- \
    "${GUEST_ATTRIBUTES}/stages" >/dev/null 2>&1 || log "stages not written"
}

# The ERR trap fires where main was called, so the reason names the step that was running (a step that already
# reported failed keeps its own, more precise reason).
on_error() {
  if [[ "${PROGRESS_PHASE:-}" != failed ]]; then
    progress failed "${PROGRESS_PHASE:-booting} step (${PROGRESS_DETAIL:-}) exited $2 at line $1"
  fi
}

# fail REASON: the boot cannot go on; say why where the monitor reads it (the deployment ends FAILED), then stop.
fail() {
  progress failed "$1"
  exit 1
}

cleanup() {
  rm -rf "${DOWNLOAD_SECRETS}"
}

trap 'on_error "${LINENO}" "$?"' ERR
trap cleanup EXIT

# retry ATTEMPTS DELAY_S COMMAND...: exponential backoff; logs the command name only, never its arguments.
retry() {
  local attempts=$1 delay=$2 n=1
  shift 2
  until "$@"; do
    if ((n >= attempts)); then
      return 1
    fi
    log "retry=${n}/${attempts} command=$1 wait=${delay}s"
    sleep "${delay}"
    n=$((n + 1))
    delay=$((delay * 2))
  done
}

# fetch_secret RESOURCE OUT_FILE: metadata-server token -> Secret Manager :access -> file (0400), all inside Python.
fetch_secret() {
  rm -f "$2.tmp"
  python3 - "${METADATA_BASE}" "${SECRETMANAGER_API}" "$1" "$2.tmp" <<'PY'
import base64, json, os, sys, urllib.request

metadata_base, api, resource, out = sys.argv[1:5]
metadata = urllib.request.Request(
    metadata_base + "/instance/service-accounts/default/token", headers={"Metadata-Flavor": "Google"}
)
with urllib.request.urlopen(metadata, timeout=10) as response:
    access = json.load(response)["access_token"]
request = urllib.request.Request(api + "v1/" + resource + ":access", headers={"Authorization": "Bearer " + access})
with urllib.request.urlopen(request, timeout=30) as response:
    payload = base64.b64decode(json.load(response)["payload"]["data"])
descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
with os.fdopen(descriptor, "wb") as handle:
    handle.write(payload)
PY
  mv -f "$2.tmp" "$2"
}

# fetch_object GS_URI OUT_FILE: metadata-server token -> Cloud Storage object GET (alt=media) -> file, in Python.
fetch_object() {
  rm -f "$2.tmp"
  python3 - "${METADATA_BASE}" "${STORAGE_API}" "$1" "$2.tmp" <<'PY'
import json, shutil, sys, urllib.parse, urllib.request

metadata_base, api, uri, out = sys.argv[1:5]
bucket, _, name = uri[len("gs://") :].partition("/")
metadata = urllib.request.Request(
    metadata_base + "/instance/service-accounts/default/token", headers={"Metadata-Flavor": "Google"}
)
with urllib.request.urlopen(metadata, timeout=10) as response:
    access = json.load(response)["access_token"]
url = api + "b/" + urllib.parse.quote(bucket, safe="") + "/o/" + urllib.parse.quote(name, safe="") + "?alt=media"
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + access})
with urllib.request.urlopen(request, timeout=120) as response, open(out, "wb") as handle:
    shutil.copyfileobj(response, handle)
PY
  mv -f "$2.tmp" "$2"
}

ensure_docker() {
  if command -v docker >/dev/null 2>&1; then
    return 0
  fi
  progress installing docker.io
  export DEBIAN_FRONTEND=noninteractive
  retry 5 10 apt-get update -q
  retry 5 10 apt-get install -y -q docker.io
}

# Weights reach the host disk once per VM through node_agent.weights_restore, run in a short-lived container of the
# pinned image with the node-agent bundle: each file the Hub lists at the revision comes from the region's cache
# bucket when its bytes have the Hub's digest, else from the Hub (and then fills the bucket). Its huggingface
# token is read from a file (HF_TOKEN_PATH) that is deleted right after.
download_weights() {
  local started report="${HF_CACHE}/tpuctl-weights-report"
  started="$(uptime_cs)"
  if [[ -f "${STATE_DIR}/${WEIGHTS_MARKER}" ]]; then
    stage_done weights "${started}" "cached,$(weights_bytes)"
    progress weights cached
    return 0
  fi
  progress weights restoring
  install -d -m 0700 "${DOWNLOAD_SECRETS}"
  if [[ -n "${HF_TOKEN_SECRET}" ]]; then
    retry 5 5 fetch_secret "${HF_TOKEN_SECRET}" "${DOWNLOAD_SECRETS}/hf-token" \
      || fail "cannot read the Hugging Face token ${HF_TOKEN_SECRET} from Secret Manager: save it (tpu_save_hf_token)"
  fi
  rm -f "${report}"
  retry 3 30 docker run --rm --name "${CONTAINER}-download" --net=host \
    -v "${HF_CACHE}:${CONTAINER_HF_CACHE}" -v "${DOWNLOAD_SECRETS}:/run/secrets/tpuctl-download:ro" \
    -v "${AGENT_DIR}:/opt/tpuctl:ro" --env PYTHONPATH=/opt/tpuctl/lib \
    --env "HF_HOME=${CONTAINER_HF_CACHE}" --env HF_TOKEN_PATH=/run/secrets/tpuctl-download/hf-token \
    --env HF_HUB_DISABLE_TELEMETRY=1 --entrypoint python3 "${IMAGE}" -m node_agent.weights_restore \
    --model "${MODEL}" --revision "${MODEL_REVISION}" --report "${CONTAINER_HF_CACHE}/tpuctl-weights-report" \
    "${WEIGHTS_CACHE_ARGS[@]}" \
    || fail "cannot restore or download ${MODEL} ${MODEL_REVISION}: check the model id, the revision and the token"
  rm -rf "${DOWNLOAD_SECRETS}"
  touch "${STATE_DIR}/${WEIGHTS_MARKER}"
  stage_done weights "${started}" "$(cat "${report}" 2>/dev/null || echo "hub,$(weights_bytes)")"
  progress weights "restored ($(cut -d , -f 1 "${report}" 2>/dev/null || echo hub))"
}

# weights_bytes: the model's size in the Hugging Face cache on the boot disk (bytes; nothing when unknown).
weights_bytes() {
  du -sb -- "${HF_CACHE}/hub/models--${MODEL//\//--}" 2>/dev/null | cut -f 1 || true
}

# compile_cache restore|fill: node_agent.compile_cache in a short-lived container of the pinned image, with the vLLM
# cache directory mounted. restore (a serving VM, before its engine starts) unpacks the region's entry for this plan
# and slice when its archive has the digest its manifest names; fill (a prewarm builder, after its first token)
# archives what the engine compiled and writes the entry. Only the builder's service account may write compile/, so
# a serving VM's fill would be refused by Cloud Storage itself. The outcome goes in the boot stages; the cache only
# ever saves time, so a restore that fails is logged and the boot goes on.
compile_cache() {
  local started report="${VLLM_CACHE}/tpuctl-compile-report" outcome
  started="$(uptime_cs)"
  rm -f "${report}"
  docker run --rm --name "${CONTAINER}-compile-cache" --net=host -v "${VLLM_CACHE}:${CONTAINER_VLLM_CACHE}" \
    -v "${AGENT_DIR}:/opt/tpuctl:ro" --env PYTHONPATH=/opt/tpuctl/lib --entrypoint python3 "${IMAGE}" \
    -m node_agent.compile_cache "$1" --model "${MODEL}" --key "${COMPILE_CACHE_KEY}" \
    --cache-dir "${CONTAINER_VLLM_CACHE}" --report "${CONTAINER_VLLM_CACHE}/tpuctl-compile-report" \
    "${WEIGHTS_CACHE_ARGS[@]}" || log "compile cache ${1}: the container exited $?"
  outcome="$(cut -d , -f 1 "${report}" 2>/dev/null || true)"
  COMPILE_OUTCOME="${outcome:-off}"
  COMPILE_REPORT="$(cat "${report}" 2>/dev/null || true)"
  stage_done "compile_${1}" "${started}" "${COMPILE_OUTCOME}"
}

# TPU chips reach vLLM's container as device nodes, not through --privileged: the vfio groups (/dev/vfio/N and the
# container device /dev/vfio/vfio) where the chips are bound to vfio-pci (v5e, v6e, v5p), /dev/accel* where they use
# the accel driver. The container has no network, so the TPU runtime's own metadata-server reads (accelerator type,
# worker id, topology) are answered by TPU_* variables read here from the same non-secret instance attributes, with
# TPU_SKIP_MDS_QUERY, as GKE answers them for TPU containers.
tpu_flags() {
  local device line
  TPU_FLAGS=()
  TPU_DEVICES=0
  for device in /dev/vfio/* /dev/accel*; do
    if [[ -c "${device}" ]]; then
      TPU_FLAGS+=(--device "${device}:${device}")
      TPU_DEVICES=$((TPU_DEVICES + 1))
    fi
  done
  while IFS= read -r -d '' line; do
    TPU_FLAGS+=(--env "${line}")
  done < <(tpu_metadata_env)
}

# tpu_metadata_env: NAME=value words, NUL-terminated, from the instance attributes a TPU VM has (none elsewhere).
tpu_metadata_env() {
  python3 - "${METADATA_BASE}" <<'PY' || true
import re, sys, urllib.request

base = sys.argv[1] + "/instance/attributes/"


def attribute(name):
    request = urllib.request.Request(base + name, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


accelerator = attribute("accelerator-type")
if accelerator:
    env = {
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": accelerator,
        "TPU_WORKER_ID": attribute("agent-worker-number") or "0",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "TPU_NAME": attribute("instance-id"),
    }
    found = dict(line.partition(":")[::2] for line in attribute("tpu-env").splitlines())
    found = {key.strip(): value.strip().strip("'\"") for key, value in found.items()}
    for source in ("HOST_BOUNDS", "CHIPS_PER_HOST_BOUNDS", "TOPOLOGY"):
        env["TPU_" + source] = found.get(source, "")
    for name, value in env.items():
        if re.fullmatch(r"[A-Za-z0-9,._:-]{1,128}", value):
            sys.stdout.write(name + "=" + value + "\0")
PY
}

compiled_on_disk() {
  [[ -n "$(find "${VLLM_CACHE}/xla_cache" "${VLLM_CACHE}/torch_compile_cache" -mindepth 1 -type f -print -quit \
    2>/dev/null)" ]]
}

vllm_healthy() {
  curl -sf -m 5 -o /dev/null --unix-socket "${SOCKET_DIR}/vllm.sock" http://localhost/health
}

# The serving container runs offline with no network at all (no metadata server, so no token for the VM's
# secrets; no route anywhere): vLLM serves on a unix socket (--uds; its --host and --port are then unused), its
# access log names each caller as the proxy reports it (FORWARDED_ALLOW_IPS: the socket's only peer is the proxy).
# It restarts on failure and is replaced only when the plan changed.
start_vllm() {
  local running_plan
  running_plan="$(docker inspect --format '{{ index .Config.Labels "tpuctl.plan-hash" }}' "${CONTAINER}" \
    2>/dev/null || true)"
  if [[ "${running_plan}" == "${PLAN_HASH}" ]] && vllm_healthy; then
    progress starting "container already serving this plan"
    return 0
  fi
  docker rm -f "${CONTAINER}" >/dev/null 2>&1 || true
  install -d -m 0700 "${SOCKET_DIR}"
  # The compile cache as the engine finds it: warm when compiled artefacts are on this disk (xla_cache:
  # VLLM_XLA_CACHE_PATH, the JAX cache on a TPU; torch_compile_cache: Inductor's, on a CPU), left by an earlier start
  # or restored from the region's shared compile cache just before, else cold. A disk that has them reads no bucket.
  COMPILE_CACHE=cold
  if compiled_on_disk; then
    COMPILE_CACHE=warm
    stage_done compile_restore "$(uptime_cs)" local
  elif [[ "${COMPILE_CACHE_ROLE}" == serve && -n "${COMPILE_CACHE_KEY}" && "${#WEIGHTS_CACHE_ARGS[@]}" -gt 0 ]]; then
    progress starting "restoring the compile cache"
    compile_cache restore
    if compiled_on_disk; then
      COMPILE_CACHE=warm
    fi
  fi
  tpu_flags
  progress starting "container (${TPU_DEVICES} TPU device nodes)"
  ENGINE_STARTED="$(uptime_cs)"  # the engine stage: this container's start until /health answers 200
  docker run -d --name "${CONTAINER}" \
    --label "tpuctl.deployment=${DEPLOYMENT_ID}" --label "tpuctl.plan-hash=${PLAN_HASH}" \
    --restart unless-stopped --net=none --shm-size 16g --ulimit memlock=-1:-1 "${TPU_FLAGS[@]}" \
    -v /dev/shm:/dev/shm -v "${HF_CACHE}:${CONTAINER_HF_CACHE}" -v "${VLLM_CACHE}:${CONTAINER_VLLM_CACHE}" \
    -v "${SERVING_SECRETS}:${CONTAINER_KEY_DIR}:ro" -v "${SOCKET_DIR}:${CONTAINER_SOCKET_DIR}" \
    -v "${AGENT_DIR}/lib/node_agent/metrics_relay.py:/opt/tpuctl/lib/node_agent/metrics_relay.py:ro" \
    --env VLLM_HOST_IP=127.0.0.1 --env 'FORWARDED_ALLOW_IPS=*' "${CONTAINER_ENV[@]}" \
    --entrypoint /bin/sh "${IMAGE}" -c "${SOCKET_WRAPPER}" "${CONTAINER_SOCKET}" \
    /bin/sh -c "${KEY_WRAPPER}" "${KEY_WRAPPER_NAME}" "${VLLM_ARGV[@]}" --uds "${CONTAINER_SOCKET}" >/dev/null
}

# The serving proxy (python -m node_agent.serving_proxy, from the node-agent bundle) is the serving port: it
# forwards an allow-list of methods and paths to vLLM's socket, checks this deployment's own API key (derived from
# the master in the same mounted file as vLLM's) on all but /health, /metrics and /version, bounds request bodies
# and streams answers back.
start_serving_proxy() {
  docker rm -f "${PROXY_CONTAINER}" >/dev/null 2>&1 || true
  docker run -d --name "${PROXY_CONTAINER}" --label "tpuctl.deployment=${DEPLOYMENT_ID}" \
    --restart unless-stopped --net=host --cap-drop ALL -v "${AGENT_DIR}:/opt/tpuctl:ro" \
    -v "${SERVING_SECRETS}:${CONTAINER_KEY_DIR}:ro" -v "${SOCKET_DIR}:${CONTAINER_SOCKET_DIR}" \
    --env PYTHONPATH=/opt/tpuctl/lib --entrypoint python3 "${IMAGE}" -m "${PROXY_MODULE}" \
    --listen "${SERVING_LISTEN}" --upstream-socket "${CONTAINER_SOCKET}" \
    --key-file "${CONTAINER_KEY_DIR}/vllm-api-key" --deployment-id "${DEPLOYMENT_ID}" >/dev/null
  progress starting "serving proxy on ${SERVING_LISTEN}"
}

# The node-agent bundle (scripts/package_node_agent.py: our wheel and its dependencies' wheels) is fetched from
# Cloud Storage, checked against the SHA-256 the controller was deployed with, and installed by the pinned image's
# pip into a host directory, offline (--no-index, no network). A digest mismatch fails the boot before vLLM starts.
install_node_agent() {
  local bundle="${AGENT_DIR}/bundle.tar.gz" actual
  if [[ -z "${NODE_AGENT_BUNDLE}" ]]; then
    return 0
  fi
  if [[ -f "${AGENT_DIR}/installed" && "$(cat "${AGENT_DIR}/installed")" == "${NODE_AGENT_BUNDLE_SHA256}" ]]; then
    progress node-agent "bundle ${NODE_AGENT_BUNDLE_SHA256:0:12} already installed"
    return 0
  fi
  progress node-agent "fetching ${NODE_AGENT_BUNDLE}"
  docker rm -f "${AGENT_CONTAINER}" >/dev/null 2>&1 || true
  rm -rf "${AGENT_DIR:?}/lib" "${AGENT_DIR:?}/wheelhouse" "${AGENT_DIR}/installed"
  if ! retry 5 5 fetch_object "${NODE_AGENT_BUNDLE}" "${bundle}"; then
    progress failed "node-agent bundle ${NODE_AGENT_BUNDLE} could not be fetched (see the boot log)"
    exit 1
  fi
  actual="$(sha256sum "${bundle}" | cut -d ' ' -f 1)"
  if [[ "${actual}" != "${NODE_AGENT_BUNDLE_SHA256}" ]]; then
    rm -f "${bundle}"
    log "the node-agent bundle is not the one the controller was deployed with: run make package, terraform apply"
    progress failed "node-agent bundle sha256 mismatch: got ${actual}, expected ${NODE_AGENT_BUNDLE_SHA256}"
    exit 1
  fi
  tar -xzf "${bundle}" -C "${AGENT_DIR}" --no-same-owner --no-same-permissions wheelhouse
  rm -f "${bundle}"
  retry 3 10 docker run --rm --net=none -v "${AGENT_DIR}:/opt/tpuctl" --entrypoint python3 "${IMAGE}" \
    -m pip install --quiet --disable-pip-version-check --no-index --find-links /opt/tpuctl/wheelhouse \
    --target /opt/tpuctl/lib "${AGENT_DISTRIBUTION}"
  rm -rf "${AGENT_DIR:?}/wheelhouse"
  printf '%s' "${NODE_AGENT_BUNDLE_SHA256}" >"${AGENT_DIR}/installed"
  progress node-agent "bundle ${NODE_AGENT_BUNDLE_SHA256:0:12} installed"
}

# The node agent (python -m node_agent.agent) runs from the pinned image's Python with the bundle installed
# into a host directory; it reads the API key from the same mounted file as vLLM. It restarts and tails the
# serving container (serving.restart, serving.logs, serving.debug) through the Docker socket mounted into it.
start_node_agent() {
  if [[ -z "${NODE_AGENT_BUNDLE}" ]]; then
    progress node-agent "not configured"
    return 0
  fi
  docker rm -f "${AGENT_CONTAINER}" >/dev/null 2>&1 || true
  # --pid=host and SYS_PTRACE: the agent reads the engine's stacks (py-spy) into a debug bundle before a restart.
  docker run -d --name "${AGENT_CONTAINER}" --label "tpuctl.deployment=${DEPLOYMENT_ID}" \
    --restart unless-stopped --net=host --pid=host --cap-add=SYS_PTRACE -v "${AGENT_DIR}:/opt/tpuctl:ro" \
    -v "${SERVING_SECRETS}:${CONTAINER_KEY_DIR}:ro" -v "${DOCKER_SOCKET}:${DOCKER_SOCKET}" \
    -v "${SOCKET_DIR}:${CONTAINER_SOCKET_DIR}:ro" --env "TPUCTL_NODE_TPU_METRICS_ADDR=unix:${TPU_METRICS_SOCKET}" \
    --env PYTHONPATH=/opt/tpuctl/lib --env "TPUCTL_NODE_DOCKER_HOST=unix://${DOCKER_SOCKET}" \
    --env "TPUCTL_NODE_CONTAINER=${CONTAINER}" "${NODE_AGENT_ENV[@]}" \
    --entrypoint python3 "${IMAGE}" -m node_agent.agent >/dev/null
  progress node-agent started
}

# first_token: after a new engine's health 200, one one-token completion straight to vLLM's socket, timed: a shape
# the engine compiles on its first request shows here, not in the engine stage. The key goes in a header file on
# tmpfs (curl -H @FILE), never in an argv; a failed probe is only logged.
first_token() {
  local started header="${SERVING_SECRETS}/first-token-header"
  started="$(uptime_cs)"
  printf 'Authorization: Bearer %s\n' "$(cat "${SERVING_SECRETS}/vllm-api-key")" >"${header}"
  if printf '%s' "${FIRST_TOKEN_BODY}" | curl -sf -m 1200 -o /dev/null --unix-socket "${SOCKET_DIR}/vllm.sock" \
    -H @"${header}" -H 'Content-Type: application/json' --data-binary @- http://localhost/v1/completions; then
    stage_done first_token "${started}"
  else
    log "first token: the one-token completion failed (the boot goes on)"
  fi
  rm -f "${header}"
}

proxy_healthy() {
  curl -sf -m 5 -o /dev/null "${HEALTH_URL}"
}

# wait_until_healthy CHECK: until CHECK (proxy_healthy, or vllm_healthy where no proxy runs) passes; then the engine
# stage and the first token. HEALTHY_AFTER: seconds waited.
wait_until_healthy() {
  local waited=0 seen="" state
  while ((waited < READY_TIMEOUT_S)); do
    if "$1"; then
      if [[ -n "${ENGINE_STARTED:-}" ]]; then
        stage_done engine "${ENGINE_STARTED}" "${COMPILE_CACHE}"
        first_token
      fi
      HEALTHY_AFTER="${waited}"
      return 0
    fi
    state="$(docker inspect --format '{{.State.Status}} restarts={{.RestartCount}}' "${CONTAINER}" \
      2>/dev/null || echo missing)"
    if [[ "${state}" != "${seen}" ]]; then
      progress compiling "container ${state}"
      seen="${state}"
    fi
    sleep 10
    waited=$((waited + 10))
  done
  progress failed "no health 200 after ${READY_TIMEOUT_S}s"
  return 1
}

wait_until_serving() {
  wait_until_healthy proxy_healthy || return 1
  progress serving "health 200 after ${HEALTHY_AFTER}s"
}

# A prewarm builder (tpuctl prewarm) serves nothing: no proxy and no node agent, so nothing listens and no prompt
# ever reaches it. Once its engine compiled and answered one token on its socket, it fills the compile cache, stops
# the engine and says prewarmed; the controller then deletes the deployment.
prewarm() {
  local outcome size sha256
  wait_until_healthy vllm_healthy || return 1
  progress compiling "filling the compile cache"
  compile_cache fill
  docker rm -f "${CONTAINER}" >/dev/null 2>&1 || true
  IFS=, read -r outcome size sha256 <<<"${COMPILE_REPORT}" || true
  case "${COMPILE_OUTCOME}" in
    filled | present) progress prewarmed "compile cache ${outcome} (${size} bytes, sha256 ${sha256:0:12})" ;;
    empty) fail "compile cache fill: the engine compiled nothing to keep (is --enforce-eager set?)" ;;
    denied) fail "compile cache fill: denied (run prewarm under Terraform's tpu_builder_service_account)" ;;
    *) fail "compile cache fill: ${COMPILE_OUTCOME} (see the boot log)" ;;
  esac
}

main() {
  local started
  install -d -m 0755 "${STATE_DIR}" "${HF_CACHE}" "${VLLM_CACHE}" "${AGENT_DIR}"
  install -d -m 0700 "${SECRETS_DIR}" "${SERVING_SECRETS}" "${SOCKET_DIR}"
  progress booting "plan ${PLAN_HASH}"
  if [[ -z "${NODE_AGENT_BUNDLE}" ]]; then
    fail "no node-agent bundle: it carries the serving proxy, the only way to vLLM (make package, terraform apply)"
  fi
  ensure_docker
  progress secrets "reading the vLLM API key"
  retry 5 5 fetch_secret "${API_KEY_SECRET}" "${SERVING_SECRETS}/vllm-api-key" \
    || fail "cannot read the vLLM API key ${API_KEY_SECRET} from Secret Manager: add a version, grant the VM access"
  started="$(uptime_cs)"
  progress image pulling
  retry 5 20 docker pull -q "${IMAGE}" >/dev/null || fail "cannot pull ${IMAGE}"
  stage_done image "${started}"
  install_node_agent
  download_weights
  start_vllm
  if [[ "${COMPILE_CACHE_ROLE}" == fill ]]; then
    prewarm
    return 0
  fi
  start_serving_proxy
  start_node_agent
  wait_until_serving
}

main "$@"
"""
