"""A PyTorch (CPU) MLP behind a plain WSGI app (``gunicorn -w 2 torch_app:app``).

Written as a user writes it: two intra-op threads (``torch.set_num_threads``),
weights made up from a fixed seed, a batch of 256 rows per request. Nothing
here knows of tuna_lab.
"""

import json

import torch

torch.set_num_threads(2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 1)).eval()
batch = torch.randn(256, 512)


def app(environ, start_response):
    with torch.inference_mode():
        mean = float(model(batch).mean())
    body = json.dumps({"mean": mean}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
