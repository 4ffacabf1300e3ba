//! Rooms over HTTP: the REST API (bearer tokens) and the dashboard's JSON (sessions with
//! CSRF), both thin layers over the gate's room methods.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use countersign_core::Principal;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::{AnyAuth, ApproverAuth};
use crate::error::GateError;
use crate::gate::{Decider, Gate};
use crate::rest::{ApiError, ApiJson, ApiPath, ApiQuery};
use crate::rooms::Room;
use crate::ui::{ApiSession, CsrfSession};

pub fn api_routes() -> Router<AppState> {
    Router::new()
        .route("/rooms", get(api_list).post(api_create))
        .route("/rooms/{room}/messages", get(api_messages).post(api_post))
        .route("/rooms/{room}/members", get(api_members))
        .route("/rooms/{room}/questions/{id}/answer", post(api_answer))
        .route("/rooms/{room}/blockers/{id}/resolve", post(api_resolve))
        .route("/rooms/{room}/{action}", post(api_admin))
}

pub fn ui_routes() -> Router<AppState> {
    Router::new()
        .route("/ui/api/rooms", get(ui_list).post(ui_create))
        .route(
            "/ui/api/rooms/{room}/messages",
            get(ui_messages).post(ui_post),
        )
        .route("/ui/api/rooms/{room}/members", get(ui_members))
        .route(
            "/ui/api/rooms/{room}/questions/{id}/answer",
            post(ui_answer),
        )
        .route(
            "/ui/api/rooms/{room}/blockers/{id}/resolve",
            post(ui_resolve),
        )
        .route("/ui/api/rooms/{room}/{action}", post(ui_admin))
}

fn room_json(room: &Room) -> Value {
    json!({
        "name": room.name,
        "title": room.title,
        "created_at": room.created_at.to_string(),
        "created_by": room.created_by,
        "deleted_at": room.deleted_at.map(|t| t.to_string()),
        "purged_at": room.purged_at.map(|t| t.to_string()),
    })
}

// ---- shared logic -----------------------------------------------------------------

async fn list(gate: &Gate) -> Result<Json<Value>, ApiError> {
    let attention = gate.attention().await?;
    let rooms: Vec<Value> = gate
        .rooms()
        .await?
        .iter()
        .map(|r| {
            let mut v = room_json(r);
            v["attention"] = json!(attention.get(&r.name).cloned().unwrap_or_default());
            v
        })
        .collect();
    Ok(Json(json!({"rooms": rooms})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    #[serde(default)]
    title: Option<String>,
}

async fn create(gate: &Gate, who: &Principal, body: CreateBody) -> Result<Json<Value>, ApiError> {
    if gate.room(&body.name).await?.is_some() {
        return Err(GateError::BadInput(format!("room {} exists", body.name)).into());
    }
    let room = gate
        .create_room(who, &body.name, body.title.as_deref())
        .await?;
    Ok(Json(room_json(&room)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessagesParams {
    since: Option<u64>,
    limit: Option<usize>,
}

async fn messages(
    gate: &Gate,
    room: &str,
    params: MessagesParams,
) -> Result<Json<Value>, ApiError> {
    let found = gate
        .room(room)
        .await?
        .ok_or_else(|| GateError::NotFound(format!("room {room}")))?;
    let since = params.since.unwrap_or(0);
    let messages = gate
        .messages(
            &found.name,
            since,
            params.limit.unwrap_or(200).clamp(1, 1000),
        )
        .await?;
    let next = messages.iter().map(|m| m.seq).max().unwrap_or(since);
    Ok(Json(
        json!({"room": room_json(&found), "messages": messages, "next_since": next}),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostBody {
    text: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

async fn members(gate: &Gate, room: &str) -> Result<Json<Value>, ApiError> {
    gate.room(room)
        .await?
        .ok_or_else(|| GateError::NotFound(format!("room {room}")))?;
    Ok(Json(json!({"members": gate.members(room).await?})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    text: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    reply: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminBody {
    #[serde(default)]
    title: Option<String>,
}

async fn post_message(
    gate: &Gate,
    who: &Principal,
    room: &str,
    body: PostBody,
) -> Result<Json<Value>, ApiError> {
    let message = gate
        .post_message(
            who,
            room,
            &body.text,
            body.kind.as_deref().unwrap_or("note"),
        )
        .await?;
    Ok(Json(json!(message)))
}

async fn answer(
    gate: &Gate,
    who: &Decider,
    room: &str,
    id: &str,
    body: AnswerBody,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(
        gate.answer_question(who, room, id, &body.text).await?
    )))
}

async fn resolve(
    gate: &Gate,
    who: &Decider,
    room: &str,
    id: &str,
    body: ResolveBody,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(
        gate.resolve_blocker(who, room, id, &body.reply).await?
    )))
}

async fn admin(
    gate: &Gate,
    who: &Decider,
    room: &str,
    action: &str,
    body: AdminBody,
) -> Result<Json<Value>, ApiError> {
    let result = match action {
        "rename" => {
            let title = body
                .title
                .ok_or_else(|| GateError::BadInput("rename needs a title".into()))?;
            json!({"room": room_json(&gate.rename_room(who, room, &title).await?)})
        }
        "delete" => json!({"room": room_json(&gate.delete_room(who, room).await?)}),
        "restore" => json!({"room": room_json(&gate.restore_room(who, room).await?)}),
        "purge" => {
            let (purged, backup) = gate.purge_room(who, room).await?;
            json!({"room": room_json(&purged), "backup": backup.display().to_string()})
        }
        other => {
            return Err(GateError::NotFound(format!(
                "room action {other} (rename, delete, restore, purge)"
            ))
            .into());
        }
    };
    Ok(Json(result))
}

// ---- REST (bearer) ----------------------------------------------------------------

async fn api_list(State(s): State<AppState>, AnyAuth(_): AnyAuth) -> Result<Json<Value>, ApiError> {
    list(&s.gate).await
}

async fn api_create(
    State(s): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Json<Value>, ApiError> {
    create(&s.gate, &who, body).await
}

async fn api_messages(
    State(s): State<AppState>,
    AnyAuth(_): AnyAuth,
    ApiPath(room): ApiPath<String>,
    ApiQuery(p): ApiQuery<MessagesParams>,
) -> Result<Json<Value>, ApiError> {
    messages(&s.gate, &room, p).await
}

async fn api_post(
    State(s): State<AppState>,
    AnyAuth(who): AnyAuth,
    ApiPath(room): ApiPath<String>,
    ApiJson(body): ApiJson<PostBody>,
) -> Result<Json<Value>, ApiError> {
    post_message(&s.gate, &who, &room, body).await
}

async fn api_members(
    State(s): State<AppState>,
    AnyAuth(_): AnyAuth,
    ApiPath(room): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    members(&s.gate, &room).await
}

async fn api_answer(
    State(s): State<AppState>,
    ApproverAuth(who): ApproverAuth,
    ApiPath((room, id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<AnswerBody>,
) -> Result<Json<Value>, ApiError> {
    answer(&s.gate, &who, &room, &id, body).await
}

async fn api_resolve(
    State(s): State<AppState>,
    ApproverAuth(who): ApproverAuth,
    ApiPath((room, id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<ResolveBody>,
) -> Result<Json<Value>, ApiError> {
    resolve(&s.gate, &who, &room, &id, body).await
}

async fn api_admin(
    State(s): State<AppState>,
    ApproverAuth(who): ApproverAuth,
    ApiPath((room, action)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Value>, ApiError> {
    admin(&s.gate, &who, &room, &action, body).await
}

// ---- dashboard (session + CSRF) ---------------------------------------------------

async fn ui_list(State(s): State<AppState>, _session: ApiSession) -> Result<Json<Value>, ApiError> {
    list(&s.gate).await
}

async fn ui_create(
    State(s): State<AppState>,
    CsrfSession(session): CsrfSession,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Json<Value>, ApiError> {
    create(&s.gate, &session.user.principal(), body).await
}

async fn ui_messages(
    State(s): State<AppState>,
    _session: ApiSession,
    ApiPath(room): ApiPath<String>,
    ApiQuery(p): ApiQuery<MessagesParams>,
) -> Result<Json<Value>, ApiError> {
    messages(&s.gate, &room, p).await
}

async fn ui_post(
    State(s): State<AppState>,
    CsrfSession(session): CsrfSession,
    ApiPath(room): ApiPath<String>,
    ApiJson(body): ApiJson<PostBody>,
) -> Result<Json<Value>, ApiError> {
    post_message(&s.gate, &session.user.principal(), &room, body).await
}

async fn ui_members(
    State(s): State<AppState>,
    _session: ApiSession,
    ApiPath(room): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    members(&s.gate, &room).await
}

async fn ui_answer(
    State(s): State<AppState>,
    CsrfSession(session): CsrfSession,
    ApiPath((room, id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<AnswerBody>,
) -> Result<Json<Value>, ApiError> {
    let who = Decider::new(session.user.principal())?;
    answer(&s.gate, &who, &room, &id, body).await
}

async fn ui_resolve(
    State(s): State<AppState>,
    CsrfSession(session): CsrfSession,
    ApiPath((room, id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<ResolveBody>,
) -> Result<Json<Value>, ApiError> {
    let who = Decider::new(session.user.principal())?;
    resolve(&s.gate, &who, &room, &id, body).await
}

async fn ui_admin(
    State(s): State<AppState>,
    CsrfSession(session): CsrfSession,
    ApiPath((room, action)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Value>, ApiError> {
    let who = Decider::new(session.user.principal())?;
    admin(&s.gate, &who, &room, &action, body).await
}
