//! Where log lines go and how they look: standard error, as text for
//! people or as one JSON object per line for log shippers (`log_format`).
//!
//! The subscriber is installed before the configuration is read, so that
//! reading it can log; the format is then switched in place (a reload
//! layer), once the configuration names one.

use std::io::IsTerminal;

use nimbus_server::LogFormat;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// Switches the format of the installed subscriber.
pub struct Format(reload::Handle<Boxed, Registry>);

impl Format {
    pub fn set(&self, format: LogFormat) -> Result<(), String> {
        self.0
            .reload(layer(format))
            .map_err(|e| format!("cannot switch the log format: {e}"))
    }
}

/// Installs the subscriber: text on standard error, `filter` deciding
/// which lines are written.
pub fn init(filter: EnvFilter) -> Format {
    let (fmt, handle) = reload::Layer::new(layer(LogFormat::Text));
    Registry::default().with(fmt).with(filter).init();
    Format(handle)
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
