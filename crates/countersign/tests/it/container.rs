//! What ships besides the binary: the container image, compose.yaml, and server.json
//! for the MCP Registry.
//!
//! The image test builds an image with buildah FROM scratch (the binary under test and
//! the shared libraries `ldd` names: the Dockerfile's final stage, without pulling a
//! base image), runs it with podman when this machine lets it, else starts the image's
//! root filesystem under `unshare`/`chroot`, and passes a request through it. The other
//! tests are offline: server.json against the registry's vendored schema, compose.yaml
//! and the Dockerfile against docs/deployment.md.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn check(python: &Path, args: &[&str]) -> Value {
    let out = Command::new(python)
        .arg(repo_root().join("tests/python/check_shipping.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check_shipping.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn server_json_follows_the_registry_schema() {
    let python = match python_with(&["jsonschema"]) {
        Ok(python) => python,
        Err(why) => return skip(&why),
    };
    let root = repo_root();
    let schema = root.join("testdata/mcp-registry/server.schema.json");
    let server_json = root.join("server.json");
    let errors = check(
        &python,
        &[
            "schema",
            schema.to_str().unwrap(),
            server_json.to_str().unwrap(),
        ],
    );
    assert_eq!(
        errors,
        json!([]),
        "server.json against the registry's schema"
    );

    let doc: Value = serde_json::from_str(&read("server.json")).unwrap();
    let vendored: Value =
        serde_json::from_str(&read("testdata/mcp-registry/server.schema.json")).unwrap();
    assert_eq!(
        doc["$schema"], vendored["$id"],
        "server.json names the vendored schema"
    );
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(doc["version"], version);
    let packages = doc["packages"].as_array().unwrap();
    let kinds: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["registryType"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, BTreeSet::from(["mcpb", "oci"]));
    for package in packages {
        let id = package["identifier"].as_str().unwrap();
        assert!(id.contains(version), "{id} is not version {version}");
    }
    let remote = &doc["remotes"][0];
    assert_eq!(remote["type"], "streamable-http");
    assert!(remote["url"].as_str().unwrap().ends_with("/mcp"));

    // The check can fail: a copy without a name, or with a package version "latest".
    let tmp = tempfile::tempdir().unwrap();
    for (what, broken) in [
        ("no name", {
            let mut d = doc.clone();
            d.as_object_mut().unwrap().remove("name");
            d
        }),
        ("version latest", {
            let mut d = doc.clone();
            d["packages"][1]["version"] = json!("latest");
            d
        }),
    ] {
        let path = write_json(tmp.path(), "broken.json", &broken);
        let errors = check(
            &python,
            &["schema", schema.to_str().unwrap(), path.to_str().unwrap()],
        );
        assert!(
            errors.as_array().is_some_and(|e| !e.is_empty()),
            "{what}: accepted"
        );
    }
}

#[test]
fn compose_and_the_dockerfile_are_what_the_deployment_guide_says() {
    let python = match python_with(&["yaml"]) {
        Ok(python) => python,
        Err(why) => return skip(&why),
    };
    let compose = check(
        &python,
        &["yaml", repo_root().join("compose.yaml").to_str().unwrap()],
    );
    let guide = read("docs/deployment.md");
    let services = compose["services"].as_object().unwrap();
    let names: BTreeSet<&str> = services.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from(["app1", "app2", "db", "init", "proxy"])
    );
    for name in &names {
        assert!(
            guide.contains(&format!("`{name}`")),
            "docs/deployment.md does not name the service {name}"
        );
    }
    for (service, image) in [
        ("db", "postgres:15-bookworm"),
        ("proxy", "nginx:1.27-bookworm"),
        ("app1", "countersign:0.1.0"),
        ("app2", "countersign:0.1.0"),
        ("init", "countersign:0.1.0"),
    ] {
        assert_eq!(services[service]["image"], image, "{service}");
        assert!(guide.contains(image), "docs/deployment.md lacks {image}");
    }
    assert_eq!(services["proxy"]["ports"], json!(["8080:80"]));
    assert!(guide.contains("8080"));
    // Two instances on one database, one keys directory, behind the proxy.
    for app in ["app1", "app2"] {
        let env = &services[app]["environment"];
        assert_eq!(services[app]["command"], json!(["serve"]));
        assert!(
            env["COUNTERSIGN_DATABASE_URL"]
                .as_str()
                .unwrap()
                .starts_with("postgres://countersign:"),
            "{env}"
        );
        for key in env.as_object().unwrap().keys() {
            assert!(
                guide.contains(key.as_str()),
                "docs/deployment.md lacks {key}"
            );
        }
        assert_eq!(
            services[app]["volumes"],
            json!(["keys:/var/lib/countersign/keys"])
        );
        assert_eq!(
            services[app]["depends_on"]["init"]["condition"],
            "service_completed_successfully"
        );
        assert_eq!(
            env["COUNTERSIGN_TRUSTED_PROXIES"],
            services["proxy"]["networks"]["backend"]["ipv4_address"]
        );
    }
    let nginx = read("deploy/nginx.conf");
    for line in [
        "server app1:8787",
        "server app2:8787",
        "proxy_read_timeout 330s;",
        "proxy_buffering off;",
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
    ] {
        assert!(nginx.contains(line), "deploy/nginx.conf lacks {line}");
    }

    let dockerfile = read("Dockerfile");
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "two stages: {froms:?}");
    assert!(froms[0].starts_with("FROM rust:") && froms[0].contains("-bookworm AS build"));
    assert!(froms[1].starts_with("FROM gcr.io/distroless/cc-debian12"));
    for line in [
        "cargo build --locked --profile dist -p countersign",
        "USER 65532:65532",
        "VOLUME [\"/var/lib/countersign\"]",
        "EXPOSE 8787",
        "CMD [\"countersign\", \"healthcheck\"]",
        "ENTRYPOINT [\"countersign\"]",
    ] {
        assert!(dockerfile.contains(line), "the Dockerfile lacks {line}");
    }
    assert!(
        read("Cargo.toml").contains("[profile.dist]"),
        "the Dockerfile builds a profile Cargo.toml lacks"
    );
}

/// A command's stdout, or why it failed.
fn sh(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{cmd:?} exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(tool))
            .find(|p| p.is_file())
    })
}

/// The files a dynamically linked binary needs: what `ldd` resolves, and the loader.
fn shared_libraries(binary: &Path) -> Vec<PathBuf> {
    let out = sh(Command::new("ldd").arg(binary)).unwrap();
    out.lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next(),
                None => line.split_whitespace().next(),
            }?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The image's root filesystem: the binary, its libraries, a passwd naming the user it
/// runs as, and the data directory that user owns.
fn assemble_rootfs(root: &Path, binary: &Path) -> Vec<PathBuf> {
    let put = |from: &Path, to: &Path| {
        let dest = root.join(to.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(from, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    };
    put(binary, Path::new("/usr/local/bin/countersign"));
    let libs = shared_libraries(binary);
    assert!(
        !libs.is_empty(),
        "ldd found nothing for {}",
        binary.display()
    );
    for lib in &libs {
        put(lib, lib);
    }
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
    for dir in ["tmp", "var/lib/countersign/keys", "proc", "dev"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    libs
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// buildah and podman, each on storage of its own under the test's directory.
#[derive(Clone)]
struct Engine {
    storage: Vec<String>,
    /// podman's own flags (the OCI runtime, the cgroup manager) that let it run here.
    podman_flags: Vec<String>,
}

impl Engine {
    fn new(dir: &Path) -> Self {
        Self {
            storage: vec![
                "--root".into(),
                dir.join("storage").display().to_string(),
                "--runroot".into(),
                dir.join("run").display().to_string(),
                "--storage-driver".into(),
                "vfs".into(),
            ],
            podman_flags: Vec::new(),
        }
    }

    fn buildah(&self, args: &[&str]) -> Result<String, String> {
        sh(Command::new("buildah")
            .args(&self.storage)
            .args(args)
            .env("BUILDAH_ISOLATION", "chroot"))
    }

    fn podman(&self, args: &[&str]) -> Result<String, String> {
        sh(Command::new("podman")
            .args(&self.storage)
            .args(&self.podman_flags)
            .args(args))
    }
}

/// How the image's process was started, and how to run a command beside it.
enum Running {
    Podman {
        engine: Engine,
        name: String,
    },
    Chroot {
        child: std::process::Child,
        rootfs: PathBuf,
    },
}

impl Running {
    /// `countersign ARGS` in the running container (as its user, in its filesystem).
    fn exec(&self, args: &[&str]) -> Result<String, String> {
        match self {
            Running::Podman { engine, name } => {
                let mut all = vec!["exec", name.as_str(), "countersign"];
                all.extend_from_slice(args);
                engine.podman(&all)
            }
            Running::Chroot { rootfs, .. } => sh(Command::new("chroot")
                .arg("--userspec=65532:65532")
                .arg(rootfs)
                .arg("/usr/local/bin/countersign")
                .args(args)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .env("COUNTERSIGN_DATA_DIR", "/var/lib/countersign")
                .env("HOME", "/tmp")),
        }
    }

    fn how(&self) -> &'static str {
        match self {
            Running::Podman { .. } => "podman run",
            Running::Chroot { .. } => "unshare + chroot of the image's root filesystem",
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        match self {
            Running::Podman { engine, name } => {
                let _ = engine.podman(&["rm", "--force", "--time", "2", name]);
            }
            Running::Chroot { child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_built_from_scratch_serves_a_request() {
    if which("buildah").is_none() {
        return skip("buildah is not installed (apt-get install buildah podman)");
    }
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = tmp.path().join("rootfs");
    let libs = assemble_rootfs(&rootfs, Path::new(bin()));
    let engine = Engine::new(tmp.path());

    // The image: FROM scratch, the files above, the Dockerfile's final-stage settings.
    let container = engine.buildah(&["from", "scratch"]).unwrap();
    let rootfs_arg = format!("{}/", rootfs.display());
    engine
        .buildah(&["copy", &container, &rootfs_arg, "/"])
        .unwrap();
    // The data directory belongs to the user the image runs as (the Dockerfile makes it
    // so in its build stage; `buildah copy --chown` would only change what it copies).
    let mount = engine.buildah(&["mount", &container]).unwrap();
    sh(Command::new("chown")
        .args(["-R", "65532:65532"])
        .arg(format!("{mount}/var/lib/countersign")))
    .unwrap();
    sh(Command::new("chmod")
        .args(["0700"])
        .arg(format!("{mount}/var/lib/countersign")))
    .unwrap();
    engine
        .buildah(&[
            "config",
            "--user",
            "65532:65532",
            "--env",
            "COUNTERSIGN_DATA_DIR=/var/lib/countersign",
            "--env",
            "COUNTERSIGN_LISTEN=0.0.0.0:8787",
            "--port",
            "8787",
            "--volume",
            "/var/lib/countersign",
            "--entrypoint",
            r#"["countersign"]"#,
            "--cmd",
            "serve",
            "--healthcheck",
            // buildah splits the command on spaces (no JSON form here).
            "CMD countersign healthcheck",
            "--healthcheck-interval",
            "15s",
            &container,
        ])
        .unwrap();
    engine
        .buildah(&[
            "commit",
            "--format",
            "docker",
            &container,
            "localhost/countersign-test:latest",
        ])
        .unwrap();
    let inspect: Value = serde_json::from_str(
        &engine
            .buildah(&[
                "inspect",
                "--type",
                "image",
                "localhost/countersign-test:latest",
            ])
            .unwrap(),
    )
    .unwrap();
    let config = &inspect["Docker"]["config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(
        config["Healthcheck"]["Test"],
        json!(["CMD", "countersign", "healthcheck"]),
        "{config}"
    );
    assert_eq!(config["Entrypoint"], json!(["countersign"]));

    // Run it: podman when this machine allows, else the same filesystem under chroot.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let name = format!("countersign-test-{port}");
    // The host's network (no bridge to set up), and limits no higher than this
    // process's: a sandbox without CAP_SYS_RESOURCE refuses to raise them. crun, podman's
    // default runtime, refuses a host whose cgroups are in hybrid mode; runc does not.
    let run = |engine: &Engine| {
        engine.podman(&[
            "run",
            "--detach",
            "--name",
            &name,
            "--network",
            "host",
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
            "localhost/countersign-test:latest",
            "serve",
            "--listen",
            &listen,
        ])
    };
    let mut podman = Err("podman is not installed".to_string());
    // COUNTERSIGN_TEST_CONTAINER=chroot tries the fallback where podman works.
    let chroot_only = std::env::var("COUNTERSIGN_TEST_CONTAINER").as_deref() == Ok("chroot");
    if chroot_only {
        podman = Err("COUNTERSIGN_TEST_CONTAINER=chroot".to_string());
    } else if which("podman").is_some() {
        let mut tried = Vec::new();
        let mut attempts = vec![Vec::new()];
        if which("runc").is_some() {
            attempts.push(vec![
                "--runtime".to_string(),
                "runc".to_string(),
                "--cgroup-manager".to_string(),
                "cgroupfs".to_string(),
            ]);
        }
        for flags in attempts {
            let engine = Engine {
                podman_flags: flags.clone(),
                ..engine.clone()
            };
            let _ = engine.podman(&["rm", "--force", &name]);
            match run(&engine) {
                Ok(_) => {
                    podman = Ok(engine);
                    break;
                }
                Err(why) => tried.push(format!("podman {flags:?}: {why}")),
            }
        }
        if podman.is_err() {
            podman = Err(tried.join("; "));
        }
    }
    let running = match podman {
        Ok(engine) => {
            eprintln!("container: podman {:?} runs the image", engine.podman_flags);
            Running::Podman {
                engine,
                name: name.clone(),
            }
        }
        Err(why) => {
            eprintln!(
                "container: podman could not run the image ({why}); starting its root filesystem under unshare/chroot"
            );
            let child = Command::new("unshare")
                .args(["--mount", "--pid", "--fork", "--kill-child"])
                .arg("chroot")
                .arg("--userspec=65532:65532")
                .arg(&mount)
                .args(["/usr/local/bin/countersign", "serve", "--listen", &listen])
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .env("COUNTERSIGN_DATA_DIR", "/var/lib/countersign")
                .env("HOME", "/tmp")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            Running::Chroot {
                child,
                rootfs: PathBuf::from(mount),
            }
        }
    };
    eprintln!(
        "container: image of {} files ({} shared libraries: {libs:?}) running via {}",
        libs.len() + 1,
        libs.len(),
        running.how()
    );

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = format!("http://{listen}");
    let mut up = false;
    for _ in 0..100 {
        if let Ok(resp) = http.get(format!("{base}/healthz")).send().await
            && resp.status() == StatusCode::OK
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs = match &running {
        Running::Podman { engine, name } => engine.podman(&["logs", name]).unwrap_or_default(),
        Running::Chroot { .. } => String::new(),
    };
    assert!(up, "the container's serve did not answer /healthz: {logs}");

    // The image's own health check, run inside it.
    let url = format!("--url={base}");
    running
        .exec(&["healthcheck", &url])
        .unwrap_or_else(|e| panic!("countersign healthcheck in the container: {e}"));

    // A request and its decision, with tokens made inside the container's data dir.
    let agent = running
        .exec(&["token", "create", "--role", "agent", "--name", "image-bot"])
        .unwrap();
    let approver = running
        .exec(&[
            "token",
            "create",
            "--role",
            "approver",
            "--name",
            "alice@example.com",
        ])
        .unwrap();
    let (status, created) = send(
        http.post(format!("{base}/api/v1/requests"))
            .bearer_auth(agent.trim())
            .json(&json!({
                "action_description": "Deploy from the image",
                "action_details": {"image": "countersign-test"}
            })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["request_id"].as_str().unwrap().to_string();
    let (status, decided) = send(
        http.post(format!("{base}/api/v1/requests/{id}/decision"))
            .bearer_auth(approver.trim())
            .json(&json!({"decision": "approved"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    let (status, view) = send(
        http.get(format!("{base}/api/v1/requests/{id}"))
            .bearer_auth(agent.trim()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["status"], "approved", "{view}");
    // The data live in the container's data directory, as its user.
    let log = running.exec(&["log", "verify"]).unwrap();
    assert!(!log.is_empty());
    drop(running);
    let _ = engine.buildah(&["rm", "--all"]);
    let _ = engine.buildah(&["rmi", "--all", "--force"]);
}

/// deploy/mcpb/build.sh packs the binary under test into the `.mcpb` server.json names:
/// the MCPB tool validates the manifest and packs it; the unpacked bundle, launched as
/// its manifest says, serves the agent tools over stdio; and the server.json it updates
/// carries the bundle's SHA-256 and still passes the registry's schema.
#[tokio::test]
async fn the_mcp_bundle_packs_validates_and_serves_the_agent_tools() {
    let root = repo_root();
    let mcpb = root.join("tests/upstreams/node_modules/.bin/mcpb");
    if !mcpb.exists() {
        return skip("the MCPB tool is missing: npm ci --prefix tests/upstreams");
    }
    let python = match python_with(&["jsonschema"]) {
        Ok(python) => python,
        Err(why) => return skip(&why),
    };
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("countersign.mcpb");
    let server_json = tmp.path().join("server.json");
    std::fs::copy(root.join("server.json"), &server_json).unwrap();
    let built = Command::new("bash")
        .arg(root.join("deploy/mcpb/build.sh"))
        .arg(bin())
        .arg(&bundle)
        .arg("--server-json")
        .arg(&server_json)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "build.sh: {}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );

    // server.json now names the bundle by its hash, and the registry's schema takes it.
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&bundle).unwrap()));
    let doc: Value = serde_json::from_slice(&std::fs::read(&server_json).unwrap()).unwrap();
    let package = doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["registryType"] == "mcpb")
        .unwrap();
    assert_eq!(package["fileSha256"], sha.as_str());
    let schema = root.join("testdata/mcp-registry/server.schema.json");
    let errors = check(
        &python,
        &[
            "schema",
            schema.to_str().unwrap(),
            server_json.to_str().unwrap(),
        ],
    );
    assert_eq!(errors, json!([]), "server.json with the bundle's hash");

    // Unpacked and launched as its manifest says, it is countersign's stdio server.
    let unpacked = tmp.path().join("unpacked");
    let status = Command::new(&mcpb)
        .arg("unpack")
        .arg(&bundle)
        .arg(&unpacked)
        .output()
        .unwrap();
    assert!(status.status.success(), "mcpb unpack: {status:?}");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(unpacked.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["version"], env!("CARGO_PKG_VERSION"));
    let config = &manifest["server"]["mcp_config"];
    let command = config["command"]
        .as_str()
        .unwrap()
        .replace("${__dirname}", unpacked.to_str().unwrap());
    let data = tmp.path().join("data");
    let mut cmd = tokio::process::Command::new(&command);
    for arg in config["args"].as_array().unwrap() {
        cmd.arg(arg.as_str().unwrap());
    }
    cmd.arg("--data-dir").arg(&data);
    use rmcp::ServiceExt;
    let (transport, _stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("launch the bundle's server");
    let client = tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("MCP handshake timed out")
        .expect("MCP handshake failed");
    let tools: Vec<String> = client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    for tool in manifest["tools"].as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        assert!(
            tools.iter().any(|t| t == name),
            "{name} not served: {tools:?}"
        );
    }
    let asked = call(
        client.peer(),
        "request_approval",
        json!({"action_description": "deploy from the bundle"}),
    )
    .await
    .unwrap();
    assert_eq!(asked["status"], "pending", "{asked}");
}
