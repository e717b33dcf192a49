"""Inference engines behind one Protocol, the router from model names to engines, the traffic split, brownout and
fault injection."""
