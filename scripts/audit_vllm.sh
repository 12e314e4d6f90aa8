#!/usr/bin/env bash
# The vLLM audit (make audit-vllm): the fault's reproduction with no model, then vLLM as shipped and with this
# project's plugin, in-process and over its OpenAI-compatible server, each added to one record. Every case of
# the serving battery runs with the two methods the verdict rests on (draft_model, ngram); the others, the
# control without speculation and the server run on the cases that say what they need to, so that the whole
# job stays within CI's time.
# Usage: scripts/audit_vllm.sh PYTHON RECORD
set -uo pipefail
PY="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"  # absolute, not resolved: the venv's own python
RECORD=$2
LOG=${VLLM_AUDIT_LOG:-_build/audit-vllm.log}
BATTERY=$(mktemp -d)
trap 'rm -rf "$BATTERY"' EXIT
mkdir -p "$(dirname "$LOG")" "$(dirname "$RECORD")"
rm -f "$RECORD.new"
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_LOGGING_LEVEL=ERROR
: > "$LOG"

# exit 0 (every case passed) and 1 (a case failed) are verdicts; anything else means the audit could not run
audit() {
  "$PY" -m speculative audit-engine "$@" --battery "$BATTERY" --record "$RECORD.new" --no-progress >>"$LOG" 2>&1
  local code=$?
  echo "audit-engine $* -> exit $code"
  [ "$code" -le 1 ] || { echo "the audit could not run; see $LOG"; tail -5 "$LOG"; exit 2; }
}

"$PY" -m speculative.audit.vllm_plugin --record "$RECORD.new" || exit 2
# as shipped: VLLM_PLUGINS names no plugin, so this project's stays out
VLLM_PLUGINS= audit vllm --as-shipped --method draft_model --method ngram --surface --run shipped
VLLM_PLUGINS= audit vllm --as-shipped --method eagle --case "T = 1" --run shipped
audit vllm --method draft_model --method ngram --method eagle --run corrected
audit vllm --method none --case "T = 1" --case "logit_bias" --run corrected
audit vllm --method draft_model_probs --method block --method suffix --case "T = 1" --run corrected
audit vllm --method draft_model --axis mixed --axis paired --axis seeded --run corrected_axes
SERVE="$PY -m vllm.entrypoints.openai.api_server --model {target} --host 127.0.0.1 --port {port} \
--skip-tokenizer-init --dtype float32 --max-model-len 64 --enforce-eager \
--speculative-config '{\"method\": \"draft_model\", \"model\": \"{draft}\", \"num_speculative_tokens\": 3}'"
VLLM_PLUGINS= audit openai --serve "VLLM_PLUGINS= $SERVE" --case "T = 1" --run http_shipped
audit openai --serve "$SERVE" --case "T = 1" --run http_corrected
mv "$RECORD.new" "$RECORD"
echo "record written to $RECORD"
