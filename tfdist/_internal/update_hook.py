"""A public hook in front of `StrategyExtended._update` (TF private contract).

`StrategyExtended.update` (how Keras's optimizers apply every gradient)
calls the private `_update` of the strategy's extended; mixing
`UpdateHook` in before a TF extended class sends it to
`update_variable(var, fn, args, kwargs, group, default=...)`, which a
tfdist subclass overrides; `default()` runs TF's own update.

Private TF API used (tested range: see setup.py): the `_update` method
of `tf.distribute.StrategyExtended` subclasses.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UpdateHook"]


class UpdateHook:
    """Mixin: a TF extended's `_update` goes through `update_variable`."""

    def _update(self, var: Any, fn: Any, args: Any, kwargs: Any, group: bool) -> Any:
        return self.update_variable(
            var,
            fn,
            args,
            kwargs,
            group,
            default=lambda: super(UpdateHook, self)._update(  # type: ignore[misc]
                var, fn, args, kwargs, group
            ),
        )

    def update_variable(
        self, var: Any, fn: Any, args: Any, kwargs: Any, group: bool, *, default: Any
    ) -> Any:
        """Updates `var` with `fn(var, *args, **kwargs)`; by default as TF does."""
        del var, fn, args, kwargs, group
        return default()
