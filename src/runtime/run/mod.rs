//! A run from its start to its end: the live run every party shares (`live.rs`), the
//! decide step and spawn (`start.rs`), the pump's drive loop (`drive.rs`), and the segment
//! writer (`segment.rs`). Agent output flows agent -> sink -> pump -> translator -> journal,
//! one way.

pub(in crate::runtime) mod budget;
mod drive;
mod inputs;
mod items;
mod segment;
mod spending;
mod start;
mod steer;
mod steer_note;

pub(in crate::runtime) use budget::RunBudget;
pub(in crate::runtime) use inputs::title_of;
