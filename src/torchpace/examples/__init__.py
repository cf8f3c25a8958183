"""Built-in example workloads. Each generates its own data locally and deterministically.

- `vision`: small ResNet-style CNN on real JPEG files written once to a cache dir (input-bound);
- `language`: small decoder transformer LM on synthetic token streams (compute-bound);
- `tabular`: MLP on in-memory features (overhead-bound);
- `inference`: the vision model in eval mode.
"""
