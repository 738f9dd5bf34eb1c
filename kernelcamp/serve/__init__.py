"""Serve: the embedded OpenAI-compatible decode server (:mod:`kernelcamp.serve.server`), its stand-in
model (:mod:`kernelcamp.serve.model`) and attention backend (:mod:`kernelcamp.serve.attention`), the
OpenAI surface it shares with the fixed-rate fake (:mod:`kernelcamp.serve.openai`,
:mod:`kernelcamp.serve.fake`), the client side of its endpoints (:mod:`kernelcamp.serve.client`) and
test helpers (:mod:`kernelcamp.serve.testing`). What a server runs is hashed by :mod:`kernelcamp.hashes`."""
