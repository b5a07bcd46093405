//! Windows permissions: a security descriptor per file, stored with it
//! (`store`), given to new files and changed as Windows does it (`assign`) and
//! enforced at CREATE with the MS-DTYP access check (`check`) against the
//! SIDs of the session (`token`).
//!
//! A file without a stored descriptor keeps the one made up from its POSIX
//! mode, and is not checked here: every user of the server acts on the
//! disk as the server's one Unix account, so only the share's rules apply
//! to it. A descriptor is stored once a client sets one, or when a file is
//! created in a directory that has one (inheritance) or with one (the
//! SD_BUFFER create context).

pub mod assign;
pub mod check;
pub mod store;
pub mod token;

pub use token::Token;
