//! Mentions in room messages: `@name`, the grammar `wait_for_message(mentions_only)`
//! and the room workers use (docs/rooms.md, "Mentions").
//!
//! - A mention starts with `@` at the start of the text or after a character that is
//!   not a name character (so `alice@example.com` in a sentence mentions nobody).
//! - The name is the longest run of name characters after the `@`, starting with a
//!   letter or digit: letters and digits
//!   (any script), `-`, `_`, `.` and `@` (a token may be named like an email address:
//!   `@alice@example.com`). Trailing `.` characters are sentence punctuation, not name.
//! - Names compare ignoring ASCII case, as token names are unique ignoring ASCII case.
//! - A name with a space in it cannot be mentioned.
//!
//! Who a principal is, for mentions: the name after the first `:` of its id (the token's
//! name for `token:deploy-bot`, the username for `user:ada`).

use crate::principal::Principal;

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '@')
}

/// The names `text` mentions, in order, each as written (duplicates kept).
pub fn mentions(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut previous: Option<char> = None;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let starts = c == '@' && !previous.is_some_and(is_name_char);
        previous = Some(c);
        if !starts {
            continue;
        }
        // A name starts with a letter or digit: `@@bob` and `@.` mention nobody.
        if !chars
            .peek()
            .is_some_and(|&(_, next)| next.is_alphanumeric())
        {
            continue;
        }
        let begin = at + 1;
        let mut end = begin;
        while let Some(&(i, next)) = chars.peek() {
            if !is_name_char(next) {
                break;
            }
            end = i + next.len_utf8();
            previous = Some(next);
            chars.next();
        }
        let name = text[begin..end].trim_end_matches('.');
        if !name.is_empty() {
            found.push(name);
        }
    }
    found
}

/// The name others mention `who` by.
pub fn mention_name(who: &Principal) -> &str {
    who.id
        .split_once(':')
        .map_or(who.id.as_str(), |(_, name)| name)
}

/// Whether `text` mentions `name` (ignoring ASCII case).
pub fn mentions_name(text: &str, name: &str) -> bool {
    mentions(text).iter().any(|m| m.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::principal::{AuthMethod, Role};

    #[test]
    fn the_grammar() {
        assert_eq!(mentions("@reviewer please look"), ["reviewer"]);
        assert_eq!(mentions("thanks @Reviewer."), ["Reviewer"]);
        assert_eq!(
            mentions("ask @deploy-bot, @qa_2 and @ops.team..."),
            ["deploy-bot", "qa_2", "ops.team"]
        );
        assert_eq!(mentions("(@alice@example.com)"), ["alice@example.com"]);
        // Not mentions: an address inside a word, a lone @, @@.
        assert!(mentions("write to alice@example.com").is_empty());
        assert!(mentions("@ alone, and @. and x@y").is_empty());
        assert_eq!(mentions("@@bob"), Vec::<&str>::new());
        assert_eq!(mentions("héllo @zoë!"), ["zoë"]);
        assert_eq!(mentions("@a @a"), ["a", "a"]);
    }

    #[test]
    fn names_compare_ignoring_ascii_case() {
        assert!(mentions_name("hey @Deploy-Bot", "deploy-bot"));
        assert!(!mentions_name("hey @deploy-bot2", "deploy-bot"));
        assert!(!mentions_name("hey @deploy", "deploy-bot"));
        assert!(!mentions_name("deploy-bot@host", "host"));
    }

    #[test]
    fn a_principal_is_mentioned_by_its_name() {
        let agent = Principal::new(
            "token:deploy-bot".into(),
            "deploy-bot",
            Role::Agent,
            AuthMethod::BearerToken,
        );
        assert_eq!(mention_name(&agent), "deploy-bot");
        let person = Principal::user("ada", "Ada Lovelace", Role::Approver);
        assert_eq!(mention_name(&person), "ada");
    }
}
