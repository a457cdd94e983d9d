"""The chat template arguments a spec gives (`[sampling] chat_template_kwargs`) that a model's
template reads: the others are dropped with a warning naming them."""

from __future__ import annotations

import logging

logger = logging.getLogger("engine")


def template_variables(tokenizer) -> set[str] | None:
    """Return the variables the tokenizer's chat template reads (jinja2's
    `meta.find_undeclared_variables`), or None when it cannot be parsed."""
    template = tokenizer.chat_template
    if not isinstance(template, str):
        return None
    try:
        import jinja2
        from jinja2 import meta

        return set(meta.find_undeclared_variables(jinja2.Environment().parse(template)))
    except Exception:  # a template jinja2's plain environment does not parse (transformers extensions)
        return None


def usable_template_kwargs(tokenizer, kwargs: dict, *, where: str, model: str) -> dict:
    """Return the entries of `kwargs` that the chat template reads; log a warning naming each
    one it does not (the prompt is then built without it). `where` is the spec section, for
    the message. A template that cannot be parsed gets the kwargs whose names it contains."""
    if not kwargs:
        return {}
    variables = template_variables(tokenizer)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    usable = {}
    for name, value in kwargs.items():
        if (name in variables) if variables is not None else (name in template):
            usable[name] = value
        else:
            logger.warning(
                "%s.%s: the chat template of %s does not use %r; prompts are built without it",
                where, name, model, name,
            )
    return usable
