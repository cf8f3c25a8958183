"""The directory `torchpace launch` puts first on the script's PYTHONPATH: it holds only the
`sitecustomize` hook (this file makes the directory ship with the package)."""
