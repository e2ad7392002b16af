//! The `toolshield` command line: breaker status and manual control through the admin API.

fn main() {
    std::process::exit(toolshield::cli::run(std::env::args_os()));
}
