//! Runnable examples of toolshield; see the `[[example]]` targets.
