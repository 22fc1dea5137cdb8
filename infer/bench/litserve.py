"""The strongest Python serving peer a user would pick for `cnninfer bench --serve`: LitServe with
its dynamic batching, the network in PyTorch (eager, cuDNN FP32, TF32 off) on the GPU.
POST /predict {"x": base64 .npy of (N, H, W, C) images} -> {"labels": [...]}, as a LitServe user
sends arrays. Not ours, not a dependency: `pip install litserve` where it is measured.

    python -m infer.bench.litserve MODEL PORT [WORKERS_PER_DEVICE API_SERVERS MAX_BATCH]

prints 'litserve: listening on URL' once /health answers."""
import base64
import io
import json
import sys
import threading
import time
import urllib.request

import litserve as ls
import numpy as np


def body(x):
    """A request's JSON body for images x."""
    b = io.BytesIO()
    np.save(b, x)
    return json.dumps({"x": base64.b64encode(b.getvalue()).decode()}).encode()


class Network(ls.LitAPI):
    """Module-level: LitServe pickles its API into each inference worker."""

    def __init__(self, model_path, **batching):
        super().__init__(**batching)
        self.model_path = model_path

    def setup(self, device):
        import torch

        from .gpu import torch_network
        from ..data.loader import load_model

        self.torch, self.dev = torch, torch.device(device)
        self.net = torch.no_grad()(torch_network(load_model(self.model_path), self.dev))

    def decode_request(self, request):
        return np.load(io.BytesIO(base64.b64decode(request["x"])))

    def batch(self, inputs):
        return np.concatenate(inputs)

    def predict(self, x):
        return self.net(self.torch.from_numpy(x.astype(np.float32)).to(self.dev)).cpu().numpy()

    def unbatch(self, output):
        return [output[i:i + 1] for i in range(len(output))]

    def encode_response(self, output):
        return {"labels": output.tolist()}


def announce(url):
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                break
        except OSError:
            time.sleep(0.2)
    print(f"litserve: listening on {url}", flush=True)


def main(model_path, port, workers_per_device=1, api_servers=4, max_batch=64, batch_timeout_s=0.001):
    import torch

    threading.Thread(target=announce, args=(f"http://127.0.0.1:{port}",), daemon=True).start()
    api = Network(model_path, max_batch_size=max_batch, batch_timeout=batch_timeout_s)
    server = ls.LitServer(api, accelerator="cuda" if torch.cuda.is_available() else "cpu", devices=1,
                          workers_per_device=workers_per_device, fast_queue=True)
    server.run(host="127.0.0.1", port=port, num_api_servers=api_servers, generate_client_file=False,
               log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6]))
