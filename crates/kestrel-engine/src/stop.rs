//! Stop strings over streamed text.

/// Outcome of feeding text to a [`StopMatcher`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text safe to emit (may be empty while a possible stop string is pending).
    Emit(String),
    /// A stop string was found: emit this text (everything before it) and stop.
    Stopped(String),
}

/// Finds stop strings in streamed text, holding back any tail that could be the start of one.
///
/// Emitted text never ends with a proper prefix of a stop string, so a stop string always
/// starts inside the held-back text: searching it alone is enough.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return StopOutcome::Emit(std::mem::take(&mut self.pending));
        }
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return StopOutcome::Stopped(out);
        }
        let hold = self.held_tail_len();
        let cut = self.pending.len() - hold;
        let rest = self.pending.split_off(cut);
        StopOutcome::Emit(std::mem::replace(&mut self.pending, rest))
    }

    /// End of stream: the held-back text.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length in bytes of the longest tail of `pending` that is a proper prefix of a stop
    /// string (on a char boundary).
    fn held_tail_len(&self) -> usize {
        let p = &self.pending;
        let longest = self.stops.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        let mut n = longest.min(p.len());
        while n > 0 {
            let start = p.len() - n;
            if p.is_char_boundary(start) {
                let tail = &p[start..];
                if self
                    .stops
                    .iter()
                    .any(|s| s.len() > n && s.starts_with(tail))
                {
                    return n;
                }
            }
            n -= 1;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopOutcome::Emit(t) => out += &t,
                StopOutcome::Stopped(t) => return (out + &t, true),
            }
        }
        (out + &m.flush(), false)
    }

    #[test]
    fn cuts_before_stop_across_pieces() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "Dxyz"]),
            ("abc ".into(), true)
        );
        assert_eq!(run(&["END"], &["abc E", "Nx"]), ("abc ENx".into(), false));
        assert_eq!(
            run(&["\n\n", "##"], &["a\n", "#", "#b"]),
            ("a\n".into(), true)
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn holds_back_possible_prefix_only() {
        let mut m = StopMatcher::new(&["abc".to_string()]);
        assert_eq!(m.push("xxab"), StopOutcome::Emit("xx".into()));
        assert_eq!(m.push("d"), StopOutcome::Emit("abd".into()));
        assert_eq!(m.push("é"), StopOutcome::Emit("é".into()));
    }
}
