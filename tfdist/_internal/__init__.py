"""tfdist internals: not public API; may change in any release."""
