"""Inference serving: the service spec (sizing, pricing and packing live in their layers)."""
