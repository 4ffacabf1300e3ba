//! `countersign completions SHELL` and `countersign man DIR`: shell completions and man
//! pages generated from the command line's own definition, so they never drift from it.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

/// Writes `shell`'s completion script for `command` to stdout.
pub fn completions(mut command: clap::Command, shell: clap_complete::Shell) -> ExitCode {
    let name = command.get_name().to_string();
    clap_complete::generate(shell, &mut command, name, &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// Writes `countersign.1` and a page per subcommand (`countersign-serve.1`,
/// `countersign-token-create.1`, ...) into `dir`, creating it.
pub fn man_pages(command: clap::Command, dir: &Path) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    let mut written = 0usize;
    write_pages(
        command.clone(),
        command.get_name().to_string(),
        dir,
        &mut written,
    )?;
    println!("wrote {written} man pages to {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

fn write_pages(
    command: clap::Command,
    name: String,
    dir: &Path,
    written: &mut usize,
) -> anyhow::Result<()> {
    let command = command.name(name.clone()).display_name(name.clone());
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone())
        .render(&mut page)
        .context("could not render a man page")?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("could not write {}", path.display()))?;
    *written += 1;
    for sub in command.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let sub_name = format!("{name}-{}", sub.get_name());
        write_pages(sub.clone(), sub_name, dir, written)?;
    }
    Ok(())
}
