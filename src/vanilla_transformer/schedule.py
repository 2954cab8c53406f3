"""Section 5.3's learning rate, the one formula that training sets and a model card reports (standard library only)."""


def paper_learning_rate(d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Peak factor of section 5.3. transformers' `inverse_sqrt` schedule multiplies it by
    min(step / warmup, sqrt(warmup / step)), which gives exactly
    lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    return scale * (d_model * warmup_steps) ** -0.5


__all__ = ["paper_learning_rate"]
