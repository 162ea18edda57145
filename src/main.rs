//! The `stepcast` binary: parse, run, report. Errors from user input (a bad file, an impossible
//! layout, a missing model) print their chain and exit with code 2; anything else exits 1.

mod cli;

use clap::{CommandFactory, FromArgMatches};

fn main() {
    // Rust ignores SIGPIPE, so printing into a closed pipe (`stepcast … | head`) would panic;
    // end quietly instead, as other command-line tools do
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let mut command = cli::Cli::command();
    // the long version digests every built-in models set: worth it only when it is asked for
    if std::env::args_os().skip(1).any(|a| a == "--version") {
        command = command.long_version(cli::long_version());
    }
    let matches = command
        .try_get_matches()
        .unwrap_or_else(|e| shorten_quoted_input(e).exit());
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(err) = cli::run(cli) {
        // a closed pipe (`stepcast … | head`) is not an error
        let broken_pipe = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
        if err.chain().any(|c| {
            c.downcast_ref::<std::io::Error>().is_some_and(broken_pipe)
                || matches!(c.downcast_ref::<stepcast::Error>(),
                    Some(stepcast::Error::Io { error, .. }) if broken_pipe(error))
        }) {
            std::process::exit(0);
        }
        eprintln!("error: {err:#}");
        let user_error = err.chain().any(|c| {
            c.downcast_ref::<stepcast::Error>().is_some()
                || c.downcast_ref::<stepcast::error::LayoutError>().is_some()
        });
        std::process::exit(if user_error { 2 } else { 1 });
    }
}

/// clap repeats a refused value, unknown argument or command whole; one pasted by mistake (a
/// whole file) would fill the terminal, so show its start and length, as our refusals do.
fn shorten_quoted_input(mut error: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let mut kinds = vec![ContextKind::InvalidValue, ContextKind::InvalidSubcommand];
    if error.kind() == ErrorKind::UnknownArgument {
        kinds.push(ContextKind::InvalidArg);
    }
    for kind in kinds {
        if let Some(ContextValue::String(value)) = error.get(kind) {
            let short = stepcast::fsutil::shortened(value);
            if short != *value {
                error.insert(kind, ContextValue::String(short));
            }
        }
    }
    error
}
