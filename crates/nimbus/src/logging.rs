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
use tracing_subscriber::layer::{Layered, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

/// The subscriber below the lines' format: the registry and the level
/// filter, itself switchable.
type Filtered = Layered<reload::Layer<EnvFilter, Registry>, Registry>;
type Boxed = Box<dyn Layer<Filtered> + Send + Sync>;

/// The installed subscriber's switches: the filter (a global one, so that
/// it can be replaced in place: a per-layer filter cannot) and the format.
pub struct Logging {
    filter: reload::Handle<EnvFilter, Registry>,
    format: reload::Handle<Boxed, Filtered>,
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
        if current.1 != filter {
            let parsed =
                EnvFilter::try_new(&filter).map_err(|e| format!("log filter \"{filter}\": {e}"))?;
            self.filter
                .reload(parsed)
                .map_err(|e| format!("cannot switch the log level: {e}"))?;
        }
        if current.0 != format {
            self.format
                .reload(layer(format))
                .map_err(|e| format!("cannot switch the log format: {e}"))?;
        }
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
    let filter = EnvFilter::try_new(&start).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter_layer, filter_handle) = reload::Layer::new(filter);
    let (format_layer, format_handle) = reload::Layer::new(layer(LogFormat::Text));
    Registry::default()
        .with(filter_layer)
        .with(format_layer)
        .init();
    Logging {
        filter: filter_handle,
        format: format_handle,
        pinned,
        current: Mutex::new((LogFormat::Text, start)),
    }
}

fn layer(format: LogFormat) -> Boxed {
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        // Colour codes only for a terminal: in a file or a pipe they are
        // noise. NO_COLOR (no-color.org) turns them off anywhere.
        LogFormat::Text => lines
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .boxed(),
        LogFormat::Json => lines.json().flatten_event(false).boxed(),
    }
}
