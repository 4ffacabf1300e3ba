//! Who is acting: the authenticated principal behind a call, and how an approver is
//! named in a proof. Identity always comes from authentication, never from an argument.

use serde::{Deserialize, Serialize};

use crate::scope::{Scope, Scopes};

/// What a credential may do. Agents ask; executors (the services that carry out approved
/// actions) verify and redeem proofs; approvers decide; admins also manage credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Agent,
    Executor,
    Approver,
    Admin,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Executor => "executor",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may decide requests. Agents and executors never may.
    pub fn may_decide(&self) -> bool {
        matches!(self, Role::Approver | Role::Admin)
    }

    /// The most a credential of this role may reach; a token may be narrowed further.
    /// The most a credential of this role may be given.
    pub fn scopes(&self) -> Scopes {
        use Scope::*;
        match self {
            Role::Agent => Scopes::of([Request, Rooms, Evidence, Verify, Gateway]),
            Role::Executor => Scopes::of([Verify, Redeem]),
            Role::Approver => Scopes::of([Request, Rooms, Evidence, Verify, Decide]),
            Role::Admin => Scopes::of([Request, Rooms, Evidence, Verify, Decide, Admin]),
        }
    }
}

impl Role {
    /// What a credential of this role gets when none are named: its role's scopes but
    /// `gateway`, which a token has only when it is created for a gateway.
    pub fn default_scopes(&self) -> Scopes {
        Scopes::of(self.scopes().iter().filter(|s| *s != Scope::Gateway))
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "agent" => Ok(Role::Agent),
            "executor" => Ok(Role::Executor),
            "approver" => Ok(Role::Approver),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role {other:?}: expected agent, executor, approver or admin"
            )),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a principal proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AuthMethod {
    /// A countersign bearer token (`countersign token create`), checked by the server.
    BearerToken,
    /// A process on the server's machine with access to the data directory, named by its
    /// operating-system user (the `countersign approve` command, a stdio MCP process).
    LocalOsUser,
    /// A dashboard account: signed in with its password, acting through its session.
    PasswordSession,
    /// A dashboard account acting from Slack: the click came in a request signed with
    /// the Slack app's signing secret, from a Slack user the operator mapped to it.
    SlackSignature,
    /// A dashboard account acting through a one-time, short-lived token emailed to the
    /// address the operator mapped to it (plus a confirm click).
    EmailToken,
}

/// Where a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// The REST API.
    Api,
    /// An MCP client with the operator tools.
    Mcp,
    /// The `countersign approve|reject` command on the server's machine.
    Cli,
    /// The web dashboard.
    Dashboard,
    /// A button in a Slack message.
    Slack,
    /// An emailed decision link (one-time token and a confirm click).
    Email,
}

impl Channel {
    pub fn as_str(&self) -> &'static str {
        match self {
            Channel::Api => "api",
            Channel::Mcp => "mcp",
            Channel::Cli => "cli",
            Channel::Dashboard => "dashboard",
            Channel::Slack => "slack",
            Channel::Email => "email",
        }
    }
}

/// An authenticated identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Stable identifier, e.g. `token:deploy-bot` or `local:alice`.
    pub id: String,
    pub display_name: String,
    pub role: Role,
    pub auth_method: AuthMethod,
    /// What this credential may reach: its role's scopes unless its token was narrowed.
    pub scopes: Scopes,
}

impl Principal {
    /// A principal with its role's default scopes ([`Role::default_scopes`]).
    pub fn new(id: String, display_name: &str, role: Role, auth_method: AuthMethod) -> Self {
        Self {
            id,
            display_name: display_name.to_string(),
            role,
            auth_method,
            scopes: role.default_scopes(),
        }
    }

    /// A principal authenticated by a bearer token with the given name.
    pub fn from_token(name: &str, role: Role) -> Self {
        Self::new(format!("token:{name}"), name, role, AuthMethod::BearerToken)
    }

    /// A principal identified by the operating-system user running a local process.
    pub fn local_user(user: &str, role: Role) -> Self {
        Self::new(format!("local:{user}"), user, role, AuthMethod::LocalOsUser)
    }

    /// A dashboard account, signed in with its password.
    pub fn user(username: &str, display_name: &str, role: Role) -> Self {
        Self::new(
            format!("user:{username}"),
            display_name,
            role,
            AuthMethod::PasswordSession,
        )
    }

    /// The same principal, narrowed to `scopes` (never widened beyond its role's).
    pub fn with_scopes(mut self, scopes: &Scopes) -> Self {
        self.scopes = scopes.intersection(&self.role.scopes());
        self
    }

    /// The same agent, its calls passing through a gateway that this server itself runs
    /// (`/mcp/gateway/<name>` on `serve`): the server forwards them, so it, not the
    /// credential, speaks for the gateway. Only an agent that may ask (`request`) calls
    /// through one; anyone else is refused with the reason.
    pub fn through_served_gateway(mut self) -> Result<Self, crate::CoreError> {
        if self.role != Role::Agent || !self.may(Scope::Request) {
            return Err(crate::CoreError::Forbidden(format!(
                "{} ({} credential, scopes {}) may not call tools through a gateway: that needs an agent token with the request scope",
                self.id, self.role, self.scopes
            )));
        }
        self.scopes = Scopes::of(self.scopes.iter().chain([Scope::Gateway]));
        Ok(self)
    }

    /// Whether this principal may reach what `scope` covers.
    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.contains(scope) && self.role.scopes().contains(scope)
    }

    /// The same principal, authenticated another way (a dashboard account acting from
    /// Slack or through an emailed token).
    pub fn authenticated_by(mut self, auth_method: AuthMethod) -> Self {
        self.auth_method = auth_method;
        self
    }

    /// This principal as the approver of a decision made through `channel`.
    pub fn as_approver(&self, channel: Channel) -> Approver {
        Approver {
            id: self.id.clone(),
            display_name: self.display_name.clone(),
            channel,
            auth_method: self.auth_method,
            account: None,
        }
    }

    pub fn as_requester(&self) -> Requester {
        Requester {
            id: self.id.clone(),
            display_name: self.display_name.clone(),
            auth_method: self.auth_method,
        }
    }
}

/// A principal allowed to decide. The only way to get one is from a principal whose
/// role may decide, so a decision path cannot be reached with an agent credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decider(Principal);

impl Decider {
    pub fn new(principal: Principal) -> Result<Self, crate::CoreError> {
        if !principal.role.may_decide() {
            Err(crate::CoreError::Forbidden(format!(
                "{} holds an {} credential; deciding requires an approver or admin token",
                principal.id, principal.role
            )))
        } else if !principal.may(Scope::Decide) {
            Err(crate::CoreError::Forbidden(format!(
                "{} is limited to the scopes {}; deciding needs the decide scope",
                principal.id, principal.scopes
            )))
        } else {
            Ok(Self(principal))
        }
    }

    pub fn principal(&self) -> &Principal {
        &self.0
    }
}

/// Who asked, as recorded on the request and in its proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requester {
    pub id: String,
    pub display_name: String,
    pub auth_method: AuthMethod,
}

/// Who decided, as recorded in a proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approver {
    pub id: String,
    pub display_name: String,
    pub channel: Channel,
    pub auth_method: AuthMethod,
    /// The account this identity counted as, for a request that needed a quorum or
    /// approvers from a group (`quorum.rs`); absent otherwise, so a one-approver
    /// decision names its approver exactly as before quorum existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_agent_that_may_ask_calls_through_a_served_gateway() {
        let agent = Principal::from_token("bot", Role::Agent);
        assert!(!agent.may(Scope::Gateway), "not by default");
        let through = agent.clone().through_served_gateway().unwrap();
        assert!(through.may(Scope::Gateway) && through.may(Scope::Request));
        assert_eq!(through.id, agent.id);
        let rooms_only = agent.with_scopes(&Scopes::of([Scope::Rooms]));
        let err = rooms_only.through_served_gateway().unwrap_err();
        assert!(err.to_string().contains("request scope"), "{err}");
        for role in [Role::Approver, Role::Admin, Role::Executor] {
            let err = Principal::from_token("x", role)
                .through_served_gateway()
                .unwrap_err();
            assert!(err.to_string().contains(role.as_str()), "{err}");
        }
    }

    #[test]
    fn only_principals_with_the_decide_scope_decide() {
        for role in [Role::Agent, Role::Executor] {
            let err = Decider::new(Principal::from_token("bot", role)).unwrap_err();
            assert!(err.to_string().contains(role.as_str()), "{err}");
        }
        let approver = Principal::from_token("alice", Role::Approver);
        assert!(Decider::new(approver.clone()).is_ok());
        let narrowed = approver.with_scopes(&Scopes::of([Scope::Rooms]));
        let err = Decider::new(narrowed).unwrap_err();
        assert!(err.to_string().contains("decide scope"), "{err}");
    }

    #[test]
    fn scopes_never_widen_beyond_the_role() {
        let executor = Principal::from_token("payments", Role::Executor)
            .with_scopes(&Scopes::of([Scope::Redeem, Scope::Decide, Scope::Admin]));
        assert_eq!(executor.scopes, Scopes::of([Scope::Redeem]));
        assert!(executor.may(Scope::Redeem));
        assert!(!executor.may(Scope::Verify) && !executor.may(Scope::Request));
        // Even a principal built with a wider set than its role cannot use it.
        let forged = Principal {
            scopes: Scopes::of(Scope::ALL),
            ..Principal::from_token("bot", Role::Agent)
        };
        assert!(!forged.may(Scope::Decide) && !forged.may(Scope::Redeem));
        for role in [Role::Agent, Role::Executor] {
            assert!(!role.scopes().contains(Scope::Decide));
            assert!(!role.scopes().contains(Scope::Admin));
        }
        assert!(!Role::Agent.scopes().contains(Scope::Redeem));
        assert_eq!(
            Role::Executor.scopes(),
            Scopes::of([Scope::Verify, Scope::Redeem])
        );
    }

    #[test]
    fn only_an_agent_token_that_names_it_speaks_for_a_gateway() {
        // An agent's token, unscoped, cannot pass itself off as the gateway in its path.
        let agent = Principal::from_token("bot", Role::Agent);
        assert!(!agent.may(Scope::Gateway) && agent.may(Scope::Request));
        let gateway = Principal::from_token("laptop-gateway", Role::Agent)
            .with_scopes(&Scopes::of([Scope::Request, Scope::Gateway]));
        assert!(gateway.may(Scope::Gateway));
        for role in [Role::Executor, Role::Approver, Role::Admin] {
            assert!(!role.scopes().contains(Scope::Gateway), "{role}");
            let forged = Principal::from_token("x", role).with_scopes(&Scopes::of(Scope::ALL));
            assert!(!forged.may(Scope::Gateway), "{role}");
        }
    }
}
