//! The `tuttid` command line: `serve`, `status`, `verify` (the daemon
//! itself is the library, `lib.rs`).

use tuttid::{attack, config, server, verify};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The tutti daemon.
#[derive(Debug, Parser)]
#[command(name = "tuttid", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Open the drives of the config and serve clients until SIGINT/SIGTERM.
    Serve {
        /// The YAML config (docs/tuttid.md).
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the daemon's drives, clients (pid, uid), queues and lease ages.
    Status {
        /// The daemon's socket.
        #[arg(long)]
        socket: PathBuf,
    },
    /// A checking client: verified striped I/O on granted queues of the
    /// daemon's drives (the QEMU guest test runs it).
    Verify(verify::VerifyArgs),
    /// A hostile client: attacks on another client's memory through a
    /// mediated drive, each of which must be refused (exit 1 if one is
    /// not). Writes LBA 0.. of the drive: a scratch drive only.
    Attack(attack::AttackArgs),
}

fn main() -> ExitCode {
    tutti_signals::init_logging_from("TUTTID_LOG");
    let r = match Cli::parse().cmd {
        Cmd::Serve { config } => serve(&config),
        Cmd::Status { socket } => status(&socket),
        Cmd::Attack(a) => match attack::run(&a) {
            Ok(n) => {
                println!("tuttid attack: {n} attacks refused; the victim's bytes and the media unchanged");
                Ok(ExitCode::SUCCESS)
            }
            Err((wrong_data, msg)) => {
                eprintln!("tuttid attack: {msg}");
                return ExitCode::from(if wrong_data { 1 } else { 3 });
            }
        },
        Cmd::Verify(a) => match verify::run(&a) {
            Ok(_) => Ok(ExitCode::SUCCESS),
            Err((wrong_data, msg)) => {
                eprintln!("tuttid verify: {msg}");
                return ExitCode::from(if wrong_data { 1 } else { 3 });
            }
        },
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = e.source();
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("tuttid: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn serve(path: &std::path::Path) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let cfg = config::DaemonConfig::from_path(path)?;
    let stop = tutti_signals::Stop::install()?;
    let server = server::Server::start(&cfg)?;
    let listener = server::bind(&cfg.socket, cfg.mode()?, cfg.socket_gid)?;
    println!("tuttid: listening on {} ({} drives)", cfg.socket.display(), cfg.drives.len());
    let flag = stop.flag();
    server.run(&listener, &flag);
    let _ = std::fs::remove_file(&cfg.socket);
    let code = stop.requested().map_or(0, |s| s.exit_code());
    eprintln!("tuttid: stopped");
    Ok(ExitCode::from(code))
}

fn status(socket: &std::path::Path) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let c = tuttid_proto::Client::connect(socket)?;
    let s = c.status()?;
    println!("drive         queues free/total  registrations  dma_faults  sq_deletion_aborts  quarantined");
    for d in &s.drives {
        println!(
            "{:<13} {:>5}/{:<11} {:>13}  {:>10}  {:>18}  {:>11}",
            d.name,
            d.queues_free,
            d.queues_total,
            d.registrations,
            d.dma_faults,
            d.sq_deletion_aborts,
            d.quarantined
        );
    }
    println!("clients: {} connected, {} reclaimed since start", s.clients.len(), s.reclaimed);
    for cl in &s.clients {
        let qs: Vec<String> = cl.queues.iter().map(|(d, q)| format!("{d}/{q}")).collect();
        println!(
            "  pid {:>7} uid {:>5} gid {:>5}  lease age {:>6} ms (idle {:>5} ms)  memory {:>10} B  queues [{}]",
            cl.pid,
            cl.uid,
            cl.gid,
            cl.connected_ms,
            cl.idle_ms,
            cl.memory_bytes,
            qs.join(", ")
        );
    }
    println!("forwarding       doorbells forwarded  invalid  SQEs mediated  refused  stray completions");
    for d in &s.drives {
        let f = &d.forwarding;
        println!(
            "  {:<13} {:>20}  {:>7}  {:>13}  {:>7}  {:>17}",
            d.name,
            f.doorbells_forwarded,
            f.doorbells_invalid,
            f.sqes_mediated,
            f.sqes_refused,
            f.stray_completions
        );
    }
    Ok(ExitCode::SUCCESS)
}
