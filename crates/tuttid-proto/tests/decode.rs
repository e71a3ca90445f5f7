//! Properties of the message codec: any byte string decodes to a typed
//! error or to a message that re-encodes identically, and every message
//! survives encode then decode.

use proptest::prelude::*;
use tuttid_proto::message::{ClientStatus, DriveStatus, QueueGrant, StatusReport};
use tuttid_proto::{Request, Response, Rule};

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9é_-]{0,40}"
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        any::<u32>().prop_map(|version| Request::Hello { version }),
        name().prop_map(|drive| Request::OpenDrive { drive }),
        (name(), any::<u32>()).prop_map(|(drive, entries)| Request::GrantQueue { drive, entries }),
        (name(), any::<u16>()).prop_map(|(drive, qid)| Request::ReleaseQueue { drive, qid }),
        (name(), any::<u64>(), any::<u64>()).prop_map(|(drive, offset, len)| Request::RegisterMemory {
            drive,
            offset,
            len
        }),
        any::<u64>().prop_map(|id| Request::UnregisterMemory { id }),
        Just(Request::Heartbeat),
        Just(Request::Status),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        (any::<u32>(), any::<u32>()).prop_map(|(version, lease_ms)| Response::HelloOk { version, lease_ms }),
        (any::<u16>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(qid, entries, a, b)| {
            Response::QueueGranted(QueueGrant {
                qid,
                entries,
                sq_iova: a,
                cq_iova: b,
                sq_len: a ^ b,
                cq_len: b,
                doorbell_page: a,
            })
        }),
        Just(Response::Done),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(id, iova, len)| Response::MemoryRegistered {
            id,
            iova,
            len
        }),
        (1u8..=12, name())
            .prop_map(|(r, detail)| Response::Refused { rule: Rule::from_u8(r).unwrap(), detail }),
        (name(), any::<u16>(), any::<u32>(), prop::collection::vec((name(), any::<u16>()), 0..4)).prop_map(
            |(n, q, pid, queues)| {
                Response::Status(StatusReport {
                    drives: vec![DriveStatus {
                        name: n,
                        queues_total: q,
                        queues_free: q / 2,
                        ..Default::default()
                    }],
                    clients: vec![ClientStatus {
                        pid,
                        uid: pid ^ 1,
                        gid: 3,
                        connected_ms: 9,
                        idle_ms: 1,
                        queues,
                        memory_bytes: 4096,
                    }],
                    reclaimed: u64::from(pid),
                })
            }
        ),
    ]
}

proptest! {
    #[test]
    fn any_bytes_decode_to_an_error_or_a_canonical_message(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(r) = Request::decode(&bytes) {
            prop_assert_eq!(r.encode(), bytes.clone());
        }
        if let Ok(r) = Response::decode(&bytes) {
            prop_assert_eq!(r.encode(), bytes);
        }
    }

    #[test]
    fn tagged_bytes_decode_to_an_error_or_a_canonical_message(tag in prop::sample::select(vec![1u8, 2, 3, 4, 5, 6, 7, 8, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87]), rest in prop::collection::vec(any::<u8>(), 0..80)) {
        let mut bytes = vec![tag];
        bytes.extend(rest);
        if let Ok(r) = Request::decode(&bytes) {
            prop_assert_eq!(r.encode(), bytes.clone());
        }
        if let Ok(r) = Response::decode(&bytes) {
            prop_assert_eq!(r.encode(), bytes);
        }
    }

    #[test]
    fn requests_round_trip(r in request()) {
        prop_assert_eq!(Request::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn responses_round_trip(r in response()) {
        prop_assert_eq!(Response::decode(&r.encode()), Ok(r));
    }
}
