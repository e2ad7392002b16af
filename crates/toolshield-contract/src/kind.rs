/// The side-effect class of a tool: it decides what the layers may do with a call.
///
/// | kind | cached | retried |
/// |---|---|---|
/// | [`ReadOnly`](CallKind::ReadOnly) | yes | yes |
/// | [`Idempotent`](CallKind::Idempotent) | no | yes |
/// | [`Mutating`](CallKind::Mutating) | no | only with an idempotency key |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum CallKind {
    /// Reads only: safe to cache and to retry.
    ReadOnly,
    /// Has side effects, but repeating it has the same effect as doing it once (a PUT).
    Idempotent,
    /// Has side effects that repeat when the call repeats (a payment, a POST).
    ///
    /// This is the default: a tool is assumed unsafe to repeat until it is declared otherwise.
    #[default]
    Mutating,
}

impl CallKind {
    /// The stable lowercase name (`read_only`, `idempotent`, `mutating`).
    pub const fn as_str(self) -> &'static str {
        match self {
            CallKind::ReadOnly => "read_only",
            CallKind::Idempotent => "idempotent",
            CallKind::Mutating => "mutating",
        }
    }

    /// Whether a result of this kind of call may be cached.
    pub const fn is_cacheable(self) -> bool {
        matches!(self, CallKind::ReadOnly)
    }

    /// The stricter of two kinds (`Mutating` > `Idempotent` > `ReadOnly`): what a call is
    /// treated as when its request and its tool's configuration disagree.
    ///
    /// ```
    /// use toolshield_contract::CallKind;
    ///
    /// assert_eq!(CallKind::ReadOnly.stricter(CallKind::Mutating), CallKind::Mutating);
    /// assert_eq!(CallKind::Idempotent.stricter(CallKind::ReadOnly), CallKind::Idempotent);
    /// ```
    pub const fn stricter(self, other: CallKind) -> CallKind {
        const fn rank(kind: CallKind) -> u8 {
            match kind {
                CallKind::ReadOnly => 0,
                CallKind::Idempotent => 1,
                CallKind::Mutating => 2,
            }
        }
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

impl std::fmt::Display for CallKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
