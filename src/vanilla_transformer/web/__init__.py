"""A model's translation page in the browser (`vanilla-transformer demo`), and the Hub Space that serves it
(`vanilla-transformer push --space`): `page.py` builds it with Gradio (the `demo` extra), `results.py` computes what it
shows through the backends' translate functions, `facts.py` reads the model card's facts, `space.py` writes the
Space's folder."""
