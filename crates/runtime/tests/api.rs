//! Integration tests of the public API against emulated drives.

use std::time::Duration;

use tutti::{
    Config, Error, HandleError, MemoryHandle, Request, RequestError, RequestStatus, Runtime, TargetHandle,
};

const T: Duration = Duration::from_secs(10);

/// Page-aligned test memory the test owns.
struct Buf {
    v: Vec<u64>,
}

impl Buf {
    fn new(bytes: usize) -> Self {
        Self { v: vec![0; bytes / 8] }
    }
    fn bytes(&mut self) -> &mut [u8] {
        let n = self.v.len() * 8;
        // u64 -> u8 view of the same memory.
        unsafe_view(&mut self.v, n)
    }
    fn register(&mut self, rt: &Runtime) -> MemoryHandle {
        let n = self.v.len() * 8;
        // SAFETY: `self` outlives the runtime in every test and its bytes are
        // only touched between submit/wait pairs.
        #[allow(unsafe_code)]
        unsafe {
            rt.register_memory(self.v.as_mut_ptr().cast(), n).unwrap()
        }
    }
}

#[allow(unsafe_code)]
fn unsafe_view(v: &mut [u64], n: usize) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirements; same length.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), n) }
}

fn striped(drives: usize) -> Runtime {
    Runtime::from_config(Config::builtin_striped_ram(drives, 64 << 20, 1 << 20)).unwrap()
}

fn fill(b: &mut [u8], seed: u8) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 12) as u8);
    }
}

#[test]
fn write_then_read_back_across_four_striped_drives() {
    let rt = striped(4);
    let info = rt.store_info("kv").unwrap();
    assert_eq!(info.drives.len(), 4);
    let mut src = Buf::new(4 << 20);
    let mut dst = Buf::new(4 << 20);
    fill(&mut src.bytes()[..], 7);
    let (ms, md) = (src.register(&rt), dst.register(&rt));
    let targets: Vec<TargetHandle> =
        (0..4).map(|i| rt.open(&format!("tutti://kv/{}", i * 3)).unwrap()).collect();
    let writes: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(i, &t)| Request::write(t, 0, 1 << 20, ms, (i as u64) << 20))
        .collect();
    let sub = rt.submit(&writes);
    assert_eq!(sub.accepted(), 4);
    let st = rt.wait(sub.op().unwrap(), T).unwrap();
    assert!(st.iter().all(RequestStatus::is_success), "{st:?}");
    // Read back in reverse order into the other buffer.
    let reads: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(i, &t)| Request::read(t, 0, 1 << 20, md, ((3 - i) as u64) << 20))
        .collect();
    let sub = rt.submit(&reads);
    let st = rt.wait(sub.op().unwrap(), T).unwrap();
    assert!(st.iter().all(RequestStatus::is_success), "{st:?}");
    let (s, d) = (src.bytes().to_vec(), dst.bytes().to_vec());
    for i in 0..4 {
        assert!(s[i << 20..(i + 1) << 20] == d[(3 - i) << 20..(4 - i) << 20], "slot {i} data differs");
    }
    rt.unregister_memory(ms).unwrap();
    rt.unregister_memory(md).unwrap();
    let report = rt.shutdown(T);
    assert_eq!(report.commands_in_flight, 0);
    assert!(report.drives.iter().all(|(_, r)| r.is_ok()), "{:?}", report.drives);
}

#[test]
fn out_of_range_request_is_refused_alone_and_the_rest_completes() {
    let rt = striped(2);
    let mut buf = Buf::new(2 << 20);
    let m = buf.register(&rt);
    let t = rt.open("tutti://kv/1").unwrap();
    let reqs = [
        Request::write(t, 0, 4096, m, 0),
        Request::write(t, (1 << 20) - 4096, 8192, m, 0), // runs past the 1 MiB slot
        Request::write(t, 4096, 2048, m, 0),             // not block aligned
        Request::write(t, 8192, 4096, m, (2 << 20) - 2048), // past the memory region
        Request::write(t, 12288, 4096, m, 4096),
    ];
    let sub = rt.submit(&reqs);
    assert!(matches!(sub.states()[1], Err(RequestError::OutOfRange { .. })));
    assert!(matches!(sub.states()[2], Err(RequestError::Unaligned { block_size: 4096, .. })));
    assert!(matches!(sub.states()[3], Err(RequestError::MemoryRange { .. })));
    let st = rt.wait(sub.op().unwrap(), T).unwrap();
    assert_eq!(st.len(), 5);
    assert_eq!(st[0], RequestStatus::Success);
    assert!(matches!(st[1], RequestStatus::NotAccepted(RequestError::OutOfRange { .. })));
    assert!(matches!(st[2], RequestStatus::NotAccepted(RequestError::Unaligned { .. })));
    assert!(matches!(st[3], RequestStatus::NotAccepted(RequestError::MemoryRange { .. })));
    assert_eq!(st[4], RequestStatus::Success);
}

#[test]
fn forged_stale_and_foreign_handles_are_refused() {
    let rt = striped(2);
    let other = striped(2);
    let mut buf = Buf::new(1 << 20);
    let m = buf.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    let (rid, slot, generation) = t.to_raw_parts();
    // Forged: a slot that was never minted, a generation from the future.
    let forged = TargetHandle::from_raw_parts(rid, slot + 100, 1);
    let future = TargetHandle::from_raw_parts(rid, slot, generation + 5);
    // Foreign: a valid handle of another runtime.
    let foreign = other.open("tutti://kv/0").unwrap();
    // Stale: closed.
    let closed = rt.open("tutti://kv/1").unwrap();
    rt.close(closed).unwrap();
    assert!(matches!(rt.close(closed), Err(Error::Handle(HandleError::Stale { .. }))));
    let sub = rt.submit(&[
        Request::read(forged, 0, 4096, m, 0),
        Request::read(future, 0, 4096, m, 0),
        Request::read(foreign, 0, 4096, m, 0),
        Request::read(closed, 0, 4096, m, 0),
        Request::read(t, 0, 4096, MemoryHandle::from_raw_parts(rid, 9, 1), 0),
        Request::read(t, 0, 4096, m, 0),
    ]);
    let s = sub.states();
    assert!(matches!(s[0], Err(RequestError::Target(HandleError::Forged { .. }))), "{s:?}");
    assert!(matches!(s[1], Err(RequestError::Target(HandleError::Forged { .. }))), "{s:?}");
    assert!(matches!(s[2], Err(RequestError::Target(HandleError::Foreign { .. }))), "{s:?}");
    assert!(matches!(s[3], Err(RequestError::Target(HandleError::Stale { .. }))), "{s:?}");
    assert!(matches!(s[4], Err(RequestError::Memory(HandleError::Forged { .. }))), "{s:?}");
    let op = sub.op().unwrap();
    let st = rt.wait(op, T).unwrap();
    assert_eq!(st[5], RequestStatus::Success);
    // The operation handle is consumed by wait.
    assert!(matches!(rt.wait(op, T), Err(Error::Handle(HandleError::Stale { .. }))));
    let (orid, os, og) = op.to_raw_parts();
    assert!(matches!(
        rt.wait(tutti::OpHandle::from_raw_parts(orid, os + 1000, og), T),
        Err(Error::Handle(HandleError::Forged { .. }))
    ));
    assert!(matches!(other.unregister_memory(m), Err(Error::Handle(HandleError::Foreign { .. }))));
}

#[test]
fn bad_uris_are_refused() {
    let rt = striped(2);
    for uri in ["kv/1", "tutti://nope/1", "tutti://kv", "tutti://kv/x", "tutti://kv/100000"] {
        assert!(matches!(rt.open(uri), Err(Error::Uri { .. })), "{uri}");
    }
    let r = rt.open_batch(&["tutti://kv/0", "tutti://kv/-1", "tutti://kv/2"]);
    assert!(r[0].is_ok() && r[1].is_err() && r[2].is_ok());
}

#[test]
fn memory_in_use_cannot_be_unregistered_until_waited() {
    let rt = striped(2);
    let mut buf = Buf::new(1 << 20);
    let m = buf.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    let sub = rt.submit(&[Request::write(t, 0, 1 << 20, m, 0)]);
    assert!(matches!(rt.unregister_memory(m), Err(Error::MemoryBusy { ops: 1 })));
    let st = rt.wait(sub.op().unwrap(), T).unwrap();
    assert!(st[0].is_success());
    rt.unregister_memory(m).unwrap();
    assert!(rt.unregister_memory(m).is_err());
}

fn four_drives_512b(mdts: u8) -> Runtime {
    let drive =
        format!("{{ emulated: {{ namespaces: [{{ capacity: 16MiB, block_size: 512 }}], mdts: {mdts} }} }}");
    let yaml = format!(
        "drives: {{ a: {drive}, b: {drive}, c: {drive}, d: {drive} }}
resolvers: {{ whole: {{ slab: {{ slot_size: 64MiB }} }} }}
datapaths: {{ s: {{ striped_local_nvme: {{ drives: [a, b, c, d], stripe_unit: 128KiB }} }} }}
stores: {{ kv: {{ resolver: whole, datapath: s }} }}
"
    );
    Runtime::from_config(Config::from_yaml_str(&yaml).unwrap()).unwrap()
}

#[test]
fn striped_read_at_100k_for_300k_touches_four_drives_with_one_command_each() {
    let rt = four_drives_512b(5);
    let t = rt.open("tutti://kv/0").unwrap();
    let mut src = Buf::new(1 << 20);
    fill(src.bytes(), 3);
    let mut dst = Buf::new(1 << 20);
    let (ms, md) = (src.register(&rt), dst.register(&rt));
    // 1 MiB = 8 stripe units = 8 commands of 128 KiB.
    let before = rt.stats().commands_submitted;
    let st = rt.wait(rt.submit(&[Request::write(t, 0, 1 << 20, ms, 0)]).op().unwrap(), T).unwrap();
    assert!(st[0].is_success());
    assert_eq!(rt.stats().commands_submitted - before, 8);
    // 100 KiB + 300 KiB: drive 0 SLBA 200 x 56, drives 1-2 SLBA 0 x 256,
    // drive 3 SLBA 0 x 32: four commands.
    let before = rt.stats().commands_submitted;
    let st = rt.wait(rt.submit(&[Request::read(t, 100 << 10, 300 << 10, md, 0)]).op().unwrap(), T).unwrap();
    assert!(st[0].is_success(), "{st:?}");
    assert_eq!(rt.stats().commands_submitted - before, 4);
    let s = src.bytes()[100 << 10..400 << 10].to_vec();
    assert!(dst.bytes()[..300 << 10] == s[..], "striped read returned other bytes");
    // 512-byte alignment is enough on 512-byte-block drives.
    let st = rt.wait(rt.submit(&[Request::read(t, 512, 1024, md, 0)]).op().unwrap(), T).unwrap();
    assert!(st[0].is_success());
    assert_eq!(&dst.bytes()[..1024], &src.bytes()[512..1536]);
}

#[test]
fn requests_larger_than_mdts_are_split_per_drive() {
    // MDTS 0 on the wire means "no limit"; use 1 (8 KiB) to force splits:
    // a 128 KiB stripe unit becomes 16 commands, 1 MiB becomes 128.
    let rt = four_drives_512b(1);
    let t = rt.open("tutti://kv/0").unwrap();
    let mut b = Buf::new(1 << 20);
    fill(b.bytes(), 9);
    let m = b.register(&rt);
    let before = rt.stats().commands_submitted;
    let st = rt.wait(rt.submit(&[Request::write(t, 0, 1 << 20, m, 0)]).op().unwrap(), T).unwrap();
    assert!(st[0].is_success());
    assert_eq!(rt.stats().commands_submitted - before, 128);
    let mut back = Buf::new(1 << 20);
    let mb = back.register(&rt);
    let st = rt.wait(rt.submit(&[Request::read(t, 0, 1 << 20, mb, 0)]).op().unwrap(), T).unwrap();
    assert!(st[0].is_success());
    assert!(back.bytes() == b.bytes());
}

fn slow_drive(latency_us: u64) -> Runtime {
    let yaml = format!(
        "drives: {{ d0: {{ emulated: {{ namespaces: [{{ capacity: 16MiB, block_size: 4096 }}], timing: {{ latency_us: {latency_us} }} }} }} }}
resolvers: {{ r: {{ slab: {{ slot_size: 1MiB }} }} }}
datapaths: {{ one: {{ local_nvme: {{ drive: d0 }} }} }}
stores: {{ kv: {{ resolver: r, datapath: one }} }}
"
    );
    Runtime::from_config(Config::from_yaml_str(&yaml).unwrap()).unwrap()
}

#[test]
fn zero_timeout_wait_and_try_wait_see_finished_work() {
    let rt = slow_drive(20_000);
    let mut b = Buf::new(1 << 20);
    let m = b.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    let op = rt.submit(&[Request::write(t, 0, 4096, m, 0)]).op().unwrap();
    assert_eq!(rt.try_wait(op).unwrap(), None, "20 ms latency: not done yet");
    std::thread::sleep(Duration::from_millis(200));
    let st = rt.wait(op, Duration::ZERO).unwrap();
    assert_eq!(st, [RequestStatus::Success]);
    let op = rt.submit(&[Request::read(t, 0, 4096, m, 0)]).op().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(rt.try_wait(op).unwrap(), Some(vec![RequestStatus::Success]));
    assert!(rt.try_wait(op).is_err(), "consumed");
    rt.unregister_memory(m).unwrap();
}

#[test]
fn timed_out_request_keeps_its_memory_until_the_drive_completes() {
    let rt = slow_drive(300_000);
    let mut b = Buf::new(1 << 20);
    let m = b.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    let op = rt.submit(&[Request::read(t, 0, 65536, m, 0)]).op().unwrap();
    let st = rt.wait(op, Duration::from_millis(20)).unwrap();
    assert_eq!(st, [RequestStatus::Timeout]);
    assert!(matches!(rt.wait(op, T), Err(Error::Handle(HandleError::Stale { .. }))));
    // The drive may still write the buffer: it stays registered.
    assert!(matches!(rt.unregister_memory(m), Err(Error::MemoryBusy { .. })));
    std::thread::sleep(Duration::from_millis(600));
    // The late completion is reaped; nothing pins the memory any more.
    rt.unregister_memory(m).unwrap();
    assert_eq!(rt.stats().late_completions, 0, "matched to its retired operation, not dropped");
    let r = rt.shutdown(T);
    assert_eq!(r.commands_in_flight, 0);
}

#[test]
fn a_namespace_with_metadata_is_refused_at_its_nsid_key_with_the_reason() {
    let yaml = "drives:\n  d0:\n    emulated:\n      namespaces:\n        - { capacity: 16MiB, block_size: 512, metadata: { bytes: 8, extended: true } }\n        - { capacity: 16MiB, block_size: 4096 }\n\
                resolvers: { kv: { slab: { slot_size: 1MiB } } }\n\
                datapaths: { one: { local_nvme: { drive: d0, nsid: 1 } } }\n\
                stores: { kv: { resolver: kv, datapath: one } }\n";
    let e = Runtime::from_config(Config::from_yaml_str(yaml).unwrap()).unwrap_err();
    let Error::Config(c) = &e else { panic!("{e:?}") };
    assert_eq!(c.path(), "datapaths.one.local_nvme.nsid");
    assert!(
        matches!(c.kind(), tutti::config::ConfigErrorKind::NamespaceUnsupported { drive, .. } if drive == "d0")
    );
    let msg = c.to_string();
    assert!(msg.contains("8 bytes of metadata") && msg.contains("nvme format"), "{msg}");
    // The namespace without metadata beside it works.
    let rt =
        Runtime::from_config(Config::from_yaml_str(&yaml.replace("nsid: 1", "nsid: 2")).unwrap()).unwrap();
    let mut buf = Buf::new(1 << 20);
    let m = buf.register(&rt);
    let t = rt.open("tutti://kv/3").unwrap();
    let st = rt.wait(rt.submit(&[Request::write(t, 0, 1 << 20, m, 0)]).op().unwrap(), T).unwrap();
    assert_eq!(st, [RequestStatus::Success]);
    rt.unregister_memory(m).unwrap();
}

#[test]
fn shutdown_with_an_unbounded_drain_does_not_overflow() {
    let rt = striped(2);
    let report = rt.shutdown(Duration::MAX);
    assert_eq!(report.ops_in_flight, 0);
    assert_eq!(report.drives.len(), 2);
    assert!(report.drives.iter().all(|(_, r)| r.is_ok()), "{:?}", report.drives);
}
