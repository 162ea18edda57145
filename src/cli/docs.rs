//! `stepcast completions <shell>` and `stepcast man`: shell completion scripts and man pages
//! generated from the same definitions that parse the command line, so they never disagree.

use std::path::PathBuf;

use clap::{Args, CommandFactory};

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write stepcast.1 and one page per command (stepcast-predict.1, …) into this directory
    /// instead of printing stepcast.1.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// The command line as users see it, with the long version `--version` prints.
fn command() -> clap::Command {
    super::Cli::command().long_version(super::long_version())
}

pub fn completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = command();
    clap_complete::generate(args.shell, &mut cmd, "stepcast", &mut std::io::stdout());
    Ok(())
}

pub fn man(args: ManArgs) -> anyhow::Result<()> {
    let cmd = command();
    let Some(dir) = args.out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        use std::io::Write;
        std::io::stdout().write_all(&page)?;
        return Ok(());
    };
    if !dir.is_dir() {
        anyhow::bail!(stepcast::Error::bad_file(
            &dir,
            "not a directory: create it first (e.g. mkdir -p ~/.local/share/man/man1)",
        ));
    }
    let mut written = Vec::new();
    write_pages(&dir, cmd, "stepcast", &mut written)?;
    println!("wrote {} man pages to {}", written.len(), dir.display());
    Ok(())
}

/// Writes the page of `cmd`, named `name.1`, and those of its subcommands (`name-sub.1`).
fn write_pages(
    dir: &std::path::Path,
    cmd: clap::Command,
    name: &str,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let cmd = cmd.name(name.to_string()).display_name(name.to_string());
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    let path = dir.join(format!("{name}.1"));
    stepcast::fsutil::write_atomic(&path, &page)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_name = format!("{name}-{}", sub.get_name());
        write_pages(dir, sub.clone(), &sub_name, written)?;
    }
    Ok(())
}
