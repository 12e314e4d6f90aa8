"""A small OpenAI-compatible server for the tests: ``GET /v1/models`` and ``POST /v1/completions`` over the
library's reference engine (engine_gallery.reference_engine), with token-id prompts and token ids back.

Started by the audit through ``--serve`` like any engine kept outside the project:

    python tests/serving_stub.py --target {target} --draft {draft} --port {port} [--bug KEY] [--text]
                                 [--die-after N]

``--bug`` plants a gallery bug; ``--text`` answers text without token ids; ``--die-after N`` exits after N
completions, mid-case.
"""

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speculative.audit.engine_gallery import reference_engine  # noqa: E402
from speculative.audit.serving import ServingConfig, load_folder  # noqa: E402


def config_of(body: dict) -> ServingConfig:
    top_k = body.get("top_k", -1)
    top_p = body.get("top_p", 1.0)
    return ServingConfig(float(body.get("temperature", 1.0)), None if top_k in (-1, 0, None) else int(top_k),
                         None if top_p in (1, 1.0, None) else float(top_p), min_p=float(body.get("min_p", 0.0)),
                         presence_penalty=float(body.get("presence_penalty", 0.0)),
                         frequency_penalty=float(body.get("frequency_penalty", 0.0)),
                         repetition_penalty=float(body.get("repetition_penalty", 1.0)),
                         logit_bias=tuple((int(t), float(b)) for t, b in (body.get("logit_bias") or {}).items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bug", default=None)
    parser.add_argument("--text", action="store_true")
    parser.add_argument("--die-after", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft = load_folder(args.target), load_folder(args.draft)
    lock = threading.Lock()
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/v1/models":
                self.answer(200, {"object": "list", "data": [{"id": args.target, "object": "model"}]})
            else:
                self.answer(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):  # noqa: N802
            if self.path != "/v1/completions":
                self.answer(404, {"error": {"message": f"no route {self.path}"}})
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                config = config_of(body)
            except ValueError as error:
                self.answer(400, {"error": {"message": str(error)}})
                return
            with lock:
                served[0] += 1
                if args.die_after is not None and served[0] > args.die_after:
                    os._exit(3)
                seed = body.get("seed")
                generator = torch.Generator().manual_seed(int(seed) if seed is not None else
                                                          int.from_bytes(os.urandom(7), "little"))
                tokens = reference_engine(target, draft, body["prompt"], int(body["max_tokens"]), config, generator,
                                          int(body.get("n", 1)), bug=args.bug)
            if args.text:
                choices = [{"index": i, "text": "".join(map(str, row))} for i, row in enumerate(tokens.tolist())]
            else:
                choices = [{"index": i, "text": "", "token_ids": row} for i, row in enumerate(tokens.tolist())]
            self.answer(200, {"object": "text_completion", "choices": choices})

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
