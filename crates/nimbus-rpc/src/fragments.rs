//! A call's REQUEST fragments joined (C706 12.6.3.4, 12.6.4.9): they come
//! in order, one call at a time, and together stay under a bound. Shared
//! by the pipe and the TCP association.

use crate::pdu::{flags, Header, Request};

/// A request whose fragments have all arrived, or are still arriving.
pub(crate) struct PartialCall {
    pub call_id: u32,
    pub context_id: u16,
    pub opnum: u16,
    pub stub: Vec<u8>,
}

#[derive(Default)]
pub(crate) struct Reassembly {
    call: Option<PartialCall>,
}

impl Reassembly {
    /// Adds one fragment; the whole call once its last fragment came.
    /// An error (a fragment out of order, of another call, or past `max`
    /// stub bytes) drops the call in progress.
    pub fn add(
        &mut self,
        hdr: &Header,
        req: &Request<'_>,
        max: usize,
    ) -> Result<Option<PartialCall>, &'static str> {
        let first = hdr.flags & flags::FIRST_FRAG != 0;
        let last = hdr.flags & flags::LAST_FRAG != 0;
        let r = match (&mut self.call, first) {
            (Some(_), true) => Err("a call began before the previous one ended"),
            (None, false) => Err("a fragment of no call in progress"),
            (Some(c), false) if c.call_id != hdr.call_id || c.context_id != req.context_id => {
                Err("a fragment of another call")
            }
            (Some(c), false) if c.stub.len() + req.stub.len() > max => {
                Err("request longer than the service accepts")
            }
            (Some(c), false) => {
                c.stub.extend_from_slice(req.stub);
                Ok(())
            }
            (None, true) if req.stub.len() > max => Err("request longer than the service accepts"),
            (None, true) => {
                self.call = Some(PartialCall {
                    call_id: hdr.call_id,
                    context_id: req.context_id,
                    opnum: req.opnum,
                    stub: req.stub.to_vec(),
                });
                Ok(())
            }
        };
        if let Err(e) = r {
            self.call = None;
            return Err(e);
        }
        Ok(if last { self.call.take() } else { None })
    }

    /// Stub bytes held for the call in progress.
    pub fn held(&self) -> usize {
        self.call.as_ref().map_or(0, |c| c.stub.len())
    }

    pub fn clear(&mut self) {
        self.call = None;
    }
}

/// How a result of `len` stub bytes goes out in fragments of at most
/// `chunk` bytes: each fragment's pfc_flags, alloc_hint (what is left,
/// C706 12.6.4.10) and stub range. An empty result is one fragment.
pub(crate) fn split(len: usize, chunk: usize) -> Vec<(u8, u32, std::ops::Range<usize>)> {
    let chunk = chunk.max(8);
    let mut out = Vec::with_capacity(len / chunk + 1);
    let mut at = 0;
    loop {
        let end = (at + chunk).min(len);
        let mut pfc = 0;
        if at == 0 {
            pfc |= flags::FIRST_FRAG;
        }
        if end == len {
            pfc |= flags::LAST_FRAG;
        }
        out.push((pfc, (len - at) as u32, at..end));
        if end == len {
            return out;
        }
        at = end;
    }
}
