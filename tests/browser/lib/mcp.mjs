// A minimal MCP client over Streamable HTTP (JSON-RPC 2.0 POSTed to /mcp with a bearer
// token; the answer is JSON or a Server-Sent Events stream), enough to call tools the way
// an agent does.

export class McpClient {
  constructor(endpoint, token) {
    this.endpoint = endpoint;
    this.token = token;
    this.sessionId = null;
    this.nextId = 1;
  }

  async post(message, { timeoutMs = 30_000 } = {}) {
    const headers = {
      authorization: `Bearer ${this.token}`,
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": "2025-06-18",
    };
    if (this.sessionId) headers["mcp-session-id"] = this.sessionId;
    const response = await fetch(this.endpoint, {
      method: "POST",
      headers,
      body: JSON.stringify(message),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const session = response.headers.get("mcp-session-id");
    if (session) this.sessionId = session;
    if (message.id === undefined) {
      await response.text();
      if (!response.ok && response.status !== 202) throw new Error(`MCP notification ${message.method}: HTTP ${response.status}`);
      return null;
    }
    if (!response.ok) throw new Error(`MCP ${message.method}: HTTP ${response.status} ${await response.text()}`);
    const type = response.headers.get("content-type") || "";
    if (type.includes("application/json")) return response.json();
    // An SSE stream: the answer is the `data:` event whose id matches ours (progress
    // notifications may come first).
    const text = await response.text();
    for (const block of text.split(/\r?\n\r?\n/)) {
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      const parsed = JSON.parse(data);
      if (parsed.id === message.id) return parsed;
    }
    throw new Error(`MCP ${message.method}: no answer in the event stream:\n${text}`);
  }

  async initialize() {
    const answer = await this.post({
      jsonrpc: "2.0",
      id: this.nextId++,
      method: "initialize",
      params: {
        protocolVersion: "2025-06-18",
        capabilities: {},
        clientInfo: { name: "countersign-browser-tests", version: "1" },
      },
    });
    if (answer.error) throw new Error(`MCP initialize: ${JSON.stringify(answer.error)}`);
    await this.post({ jsonrpc: "2.0", method: "notifications/initialized" });
    return answer.result;
  }

  /** Calls a tool; returns its structured content, or throws with its error text. */
  async callTool(name, args, { timeoutMs = 30_000 } = {}) {
    const answer = await this.post(
      { jsonrpc: "2.0", id: this.nextId++, method: "tools/call", params: { name, arguments: args } },
      { timeoutMs },
    );
    if (answer.error) throw new Error(`MCP ${name}: ${JSON.stringify(answer.error)}`);
    const result = answer.result;
    if (result.isError) {
      throw new Error(`MCP ${name} failed: ${(result.content || []).map((c) => c.text).join(" ")}`);
    }
    if (result.structuredContent) return result.structuredContent;
    return JSON.parse(result.content[0].text);
  }
}

/** The statement inside a DSSE proof envelope. */
export function statementOf(proof) {
  if (!proof || !proof.payload) throw new Error(`not a DSSE envelope: ${JSON.stringify(proof)}`);
  return JSON.parse(Buffer.from(proof.payload, "base64").toString("utf8"));
}
