//! Where log lines go and how they look: standard error, as text for
//! people or as one JSON object per line for log shippers (`log_format`),
//! from the level `log_level` names on.
//!
//! The subscriber is installed before the configuration is read, so that
//! reading it can log; format and level are then switched in place (a
//! reload layer), once the configuration names them, and again at each
//! reload. `-v` and NIMBUS_LOG, when given, pin the level: the
//! configuration's is then not used.

use std::io::IsTerminal;
use std::sync::Mutex;

use nimbus_server::LogFormat;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// The installed subscriber's switch.
pub struct Logging {
    handle: reload::Handle<Boxed, Registry>,
    /// The filter `-v` or NIMBUS_LOG gave, which the configuration does
    /// not override.
    pinned: Option<String>,
    /// What is in place: a reload that changes neither is not applied.
    current: Mutex<(LogFormat, String)>,
}

impl Logging {
    /// Puts `format` and `level` (unless pinned) in place.
    pub fn apply(&self, format: LogFormat, level: &str) -> Result<(), String> {
        let filter = self.pinned.clone().unwrap_or_else(|| level.to_string());
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.0 == format && current.1 == filter {
            return Ok(());
        }
        let layer = layer(format, &filter)?;
        self.handle
            .reload(layer)
            .map_err(|e| format!("cannot switch the log format: {e}"))?;
        if self.pinned.is_some() && level != "info" {
            tracing::info!(
                "log_level = \"{level}\" is not used: -v or NIMBUS_LOG sets the level ({filter})"
            );
        }
        *current = (format, filter);
        Ok(())
    }
}

/// Installs the subscriber: text on standard error, at level info or at
/// `pinned` (a filter directive from `-v` or NIMBUS_LOG).
pub fn init(pinned: Option<String>) -> Logging {
    let start = pinned.clone().unwrap_or_else(|| "info".to_string());
    let first = layer(LogFormat::Text, &start).unwrap_or_else(|_| {
        layer(LogFormat::Text, "info")
            .unwrap_or_else(|_| Box::new(tracing_subscriber::fmt::layer()))
    });
    let (fmt, handle) = reload::Layer::new(first);
    Registry::default().with(fmt).init();
    Logging {
        handle,
        pinned,
        current: Mutex::new((LogFormat::Text, start)),
    }
}

fn layer(format: LogFormat, filter: &str) -> Result<Boxed, String> {
    let filter = EnvFilter::try_new(filter).map_err(|e| format!("log filter \"{filter}\": {e}"))?;
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    Ok(match format {
        // Colour codes only for a terminal: in a file or a pipe they are
        // noise. NO_COLOR (no-color.org) turns them off anywhere.
        LogFormat::Text => lines
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(false)
            .with_filter(filter)
            .boxed(),
    })
}
