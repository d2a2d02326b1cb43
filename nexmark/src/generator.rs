//! The Nexmark event model: people, auctions and bids, each a pure
//! function of its event number.
//!
//! Semantics are Apache Beam's reference generator (`sdks/java/testing/
//! nexmark/.../sources/generator`), which the Flink port copies:
//! - event `e` is a person when `e % 50 == 0`, an auction when it is 1..=3,
//!   otherwise a bid (1 : 3 : 46);
//! - ids follow from `e` alone (people and auctions are numbered in event
//!   order from 1000), and bids point at recent auctions and people, half
//!   of them at the "hot" auction of the current block of 100;
//! - every other field comes from a `java.util.Random` seeded with the
//!   event's id, drawn in Beam's order, so with seed 0 the rows are
//!   Beam's, byte for byte (the tests check Beam's own output).
//!
//! Sluice's one change: event time. Event `n` happens `n / rate` seconds
//! after the timeline's anchor (Beam rounds the gap between events to whole
//! microseconds, which is 0 above 2 M events/s), truncated to milliseconds
//! as Beam's timestamps are.

use crate::random::JavaRandom;

/// Event kinds, in their proportions out of [`PROPORTION_DENOMINATOR`].
const PERSON_PROPORTION: i64 = 1;
const AUCTION_PROPORTION: i64 = 3;
const PROPORTION_DENOMINATOR: i64 = 50;

const FIRST_PERSON_ID: i64 = 1000;
const FIRST_AUCTION_ID: i64 = 1000;
const FIRST_CATEGORY_ID: i64 = 10;
const NUM_CATEGORIES: i32 = 5;
/// Bids may name people and auctions this far beyond the newest.
const PERSON_ID_LEAD: i64 = 10;
const AUCTION_ID_LEAD: i64 = 10;
/// The block width for hot sellers, auctions and bidders.
const HOT_BLOCK: i64 = 100;
/// Beam's defaults: 1 in 2 bids go to the hot auction, 3 in 4 to the hot
/// bidder, 3 in 4 auctions to the hot seller.
const HOT_AUCTION_RATIO: i32 = 2;
const HOT_BIDDER_RATIO: i32 = 4;
const HOT_SELLER_RATIO: i32 = 4;
const NUM_ACTIVE_PEOPLE: i64 = 1000;
const NUM_IN_FLIGHT_AUCTIONS: i64 = 100;
const AVG_PERSON_BYTES: i32 = 200;
const AVG_AUCTION_BYTES: i32 = 500;
const AVG_BID_BYTES: i32 = 100;

const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];

/// What event `e` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A new person.
    Person,
    /// A new auction.
    Auction,
    /// A bid.
    Bid,
}

impl Kind {
    /// The kind of event `e`.
    pub fn of(e: i64) -> Self {
        let rem = e % PROPORTION_DENOMINATOR;
        if rem < PERSON_PROPORTION {
            Self::Person
        } else if rem < PERSON_PROPORTION + AUCTION_PROPORTION {
            Self::Auction
        } else {
            Self::Bid
        }
    }
}

/// When events happen: event `n` at `anchor_ms + (n - anchor_event) /
/// rate` seconds, in whole milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    /// An event whose time is known.
    pub anchor_event: i64,
    /// Its time, ms since the Unix epoch.
    pub anchor_ms: i64,
    /// Events per second.
    pub rate: u64,
}

impl Timeline {
    /// Event `n`'s time, ms since the Unix epoch.
    pub fn ms(&self, n: i64) -> i64 {
        let since = i128::from(n - self.anchor_event) * 1_000 / i128::from(self.rate.max(1));
        self.anchor_ms + since as i64
    }
}

/// A person: someone who sells and bids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub id: i64,
    pub name: String,
    pub email_address: String,
    pub credit_card: String,
    pub city: &'static str,
    pub state: &'static str,
    /// ms since the Unix epoch.
    pub date_time: i64,
    pub extra: String,
}

/// An auction: an item for sale until `expires`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auction {
    pub id: i64,
    pub item_name: String,
    pub description: String,
    pub initial_bid: i64,
    pub reserve: i64,
    /// ms since the Unix epoch.
    pub date_time: i64,
    /// ms since the Unix epoch.
    pub expires: i64,
    pub seller: i64,
    pub category: i64,
    pub extra: String,
}

/// A bid on an auction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bid {
    pub auction: i64,
    pub bidder: i64,
    pub price: i64,
    /// Where the bid came from: Flink's generator only.
    pub channel: Option<Channel>,
    /// ms since the Unix epoch.
    pub date_time: i64,
    pub extra: String,
}

/// A bid's channel and the URL it came through, as Flink's generator
/// makes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    pub name: String,
    pub url: String,
}

/// Generates events of one stream: a seed and a timeline.
#[derive(Debug, Clone, Copy)]
pub struct Generator {
    /// 0 gives Beam's rows; another seed, other rows of the same shape.
    pub seed: u64,
    pub timeline: Timeline,
    /// Flink's generator: bids carry a channel and a URL, drawn after the
    /// price (so their `extra` differs from Beam's).
    pub flink: bool,
}

/// Flink's hot channels: half the bids come through one of them.
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
const HOT_CHANNELS_RATIO: i32 = 2;
const CHANNELS: i32 = 10_000;

impl Generator {
    fn random(&self, e: i64) -> JavaRandom {
        // Seed 0 must leave Beam's seeding (the event id) untouched.
        JavaRandom::new(e.wrapping_add(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64))
    }

    /// Event `e`, a person (`Kind::of(e) == Kind::Person`).
    pub fn person(&self, e: i64) -> Person {
        let r = &mut self.random(e);
        let name = format!(
            "{} {}",
            FIRST_NAMES[r.next_int_below(FIRST_NAMES.len() as i32) as usize],
            LAST_NAMES[r.next_int_below(LAST_NAMES.len() as i32) as usize]
        );
        let email_address = format!("{}@{}.com", next_string(r, 7), next_string(r, 5));
        let credit_card = (0..4)
            .map(|_| format!("{:04}", r.next_int_below(10_000)))
            .collect::<Vec<_>>()
            .join(" ");
        let city = US_CITIES[r.next_int_below(US_CITIES.len() as i32) as usize];
        let state = US_STATES[r.next_int_below(US_STATES.len() as i32) as usize];
        let size =
            8 + name.len() + email_address.len() + credit_card.len() + city.len() + state.len();
        let extra = next_extra(r, size as i32, AVG_PERSON_BYTES);
        Person {
            id: last_person(e) + FIRST_PERSON_ID,
            name,
            email_address,
            credit_card,
            city,
            state,
            date_time: self.timeline.ms(e),
            extra,
        }
    }

    /// Event `e`, an auction.
    pub fn auction(&self, e: i64) -> Auction {
        let r = &mut self.random(e);
        let date_time = self.timeline.ms(e);
        let seller = if r.next_int_below(HOT_SELLER_RATIO) > 0 {
            (last_person(e) / HOT_BLOCK) * HOT_BLOCK
        } else {
            next_person(e, r)
        } + FIRST_PERSON_ID;
        let category = FIRST_CATEGORY_ID + i64::from(r.next_int_below(NUM_CATEGORIES));
        let initial_bid = next_price(r);
        // Auctions last about as long as it takes for the next
        // NUM_IN_FLIGHT_AUCTIONS auctions to start.
        let events_for_auctions =
            NUM_IN_FLIGHT_AUCTIONS * PROPORTION_DENOMINATOR / AUCTION_PROPORTION;
        let horizon = self.timeline.ms(e + events_for_auctions) - date_time;
        let expires = date_time + 1 + next_long(r, (horizon * 2).max(1));
        let item_name = next_string(r, 20);
        let description = next_string(r, 100);
        let reserve = initial_bid + next_price(r);
        let size = 8 + item_name.len() + description.len() + 40;
        let extra = next_extra(r, size as i32, AVG_AUCTION_BYTES);
        Auction {
            id: last_auction(e) + FIRST_AUCTION_ID,
            item_name,
            description,
            initial_bid,
            reserve,
            date_time,
            expires,
            seller,
            category,
            extra,
        }
    }

    /// Event `e`, a bid.
    pub fn bid(&self, e: i64) -> Bid {
        let r = &mut self.random(e);
        let auction = if r.next_int_below(HOT_AUCTION_RATIO) > 0 {
            (last_auction(e) / HOT_BLOCK) * HOT_BLOCK
        } else {
            next_auction(e, r)
        } + FIRST_AUCTION_ID;
        let bidder = if r.next_int_below(HOT_BIDDER_RATIO) > 0 {
            (last_person(e) / HOT_BLOCK) * HOT_BLOCK + 1
        } else {
            next_person(e, r)
        } + FIRST_PERSON_ID;
        let price = next_price(r);
        let channel = self.flink.then(|| {
            if r.next_int_below(HOT_CHANNELS_RATIO) > 0 {
                let i = r.next_int_below(HOT_CHANNELS.len() as i32);
                Channel {
                    name: HOT_CHANNELS[i as usize].to_string(),
                    url: self.base_url(i64::from(i)),
                }
            } else {
                self.channel(r.next_int_below(CHANNELS))
            }
        });
        let extra = next_extra(r, 32, AVG_BID_BYTES);
        Bid {
            auction,
            bidder,
            price,
            channel,
            date_time: self.timeline.ms(e),
            extra,
        }
    }

    /// A URL of three random path parts, as Flink's generator makes them;
    /// drawn from a random seeded by `n`, where Flink's is unseeded, so the
    /// same channel has the same URL in every run.
    fn base_url(&self, n: i64) -> String {
        let r = &mut self.random(-1 - n);
        let mut url = String::from("https://www.nexmark.com/");
        for _ in 0..3 {
            url.push_str(&next_string_with(r, 5, '_'));
            url.push('/');
        }
        url.push_str("item.htm?query=1");
        url
    }

    /// Channel `n` of the ones that are not hot: `channel-<n>`, its URL
    /// carrying its id nine times out of ten.
    fn channel(&self, n: i32) -> Channel {
        let mut url = self.base_url(i64::from(HOT_CHANNELS.len() as i32) + i64::from(n));
        if self.random(-1_000_000 - i64::from(n)).next_int_below(10) > 0 {
            url.push_str(&format!("&channel_id={}", n.reverse_bits().unsigned_abs()));
        }
        Channel {
            name: format!("channel-{n}"),
            url,
        }
    }
}

/// The newest person (base 0) as of event `e`.
fn last_person(e: i64) -> i64 {
    let (epoch, offset) = (e / PROPORTION_DENOMINATOR, e % PROPORTION_DENOMINATOR);
    epoch * PERSON_PROPORTION + offset.min(PERSON_PROPORTION - 1)
}

/// The newest auction (base 0) as of event `e`; -1 before the first.
fn last_auction(e: i64) -> i64 {
    let (mut epoch, mut offset) = (e / PROPORTION_DENOMINATOR, e % PROPORTION_DENOMINATOR);
    if offset < PERSON_PROPORTION {
        // A person's slot: the last auction of the previous epoch.
        epoch -= 1;
        offset = AUCTION_PROPORTION - 1;
    } else if offset >= PERSON_PROPORTION + AUCTION_PROPORTION {
        offset = AUCTION_PROPORTION - 1;
    } else {
        offset -= PERSON_PROPORTION;
    }
    epoch * AUCTION_PROPORTION + offset
}

/// A recent person (base 0), possibly a few not yet created.
fn next_person(e: i64, r: &mut JavaRandom) -> i64 {
    let people = last_person(e) + 1;
    let active = people.min(NUM_ACTIVE_PEOPLE);
    people - active + next_long(r, active + PERSON_ID_LEAD)
}

/// A recent auction (base 0), possibly a few not yet created.
fn next_auction(e: i64, r: &mut JavaRandom) -> i64 {
    let max = last_auction(e);
    let min = (max - NUM_IN_FLIGHT_AUCTIONS).max(0);
    min + next_long(r, max - min + 1 + AUCTION_ID_LEAD)
}

/// Beam's `LongGenerator.nextLong`: `0..n`.
fn next_long(r: &mut JavaRandom, n: i64) -> i64 {
    if n < i64::from(i32::MAX) {
        i64::from(r.next_int_below(n as i32))
    } else {
        (r.next_long() % n).abs()
    }
}

/// Log-uniform cents, 100 to 10^8.
fn next_price(r: &mut JavaRandom) -> i64 {
    (10f64.powf(r.next_double() * 6.0) * 100.0).round() as i64
}

/// Lowercase letters with an occasional space, 3 to `max_length - 1`
/// long before trimming.
fn next_string(r: &mut JavaRandom, max_length: i32) -> String {
    next_string_with(r, max_length, ' ')
}

/// Lowercase letters with an occasional `special`, 3 to `max_length - 1`
/// long, with white space trimmed (Java's `trim`).
fn next_string_with(r: &mut JavaRandom, max_length: i32, special: char) -> String {
    let length = 3 + r.next_int_below(max_length - 3);
    let mut s = String::with_capacity(length as usize);
    for _ in 0..length {
        if r.next_int_below(13) == 0 {
            s.push(special);
        } else {
            s.push((b'a' + r.next_int_below(26) as u8) as char);
        }
    }
    s.trim_matches(' ').to_string()
}

/// Exactly `length` characters, six per random int. Java's remainder of a
/// negative int is negative, so characters from 'H' to '`' occur too: kept,
/// as the reference generator makes them.
fn next_exact_string(r: &mut JavaRandom, length: i32) -> String {
    let mut s = String::with_capacity(length.max(0) as usize);
    let (mut rnd, mut left) = (0i32, 0);
    for _ in 0..length {
        if left == 0 {
            rnd = r.next_int();
            left = 6;
        }
        s.push((i32::from(b'a') + rnd % 26) as u8 as char);
        rnd /= 26;
        left -= 1;
    }
    s
}

/// Padding that brings a record to about `average` bytes.
fn next_extra(r: &mut JavaRandom, current: i32, average: i32) -> String {
    if current > average {
        return String::new();
    }
    let gap = average - current;
    let delta = (f64::from(gap) * 0.2 + 0.5).floor() as i32;
    let size = gap - delta
        + if delta == 0 {
            0
        } else {
            r.next_int_below(2 * delta)
        };
    next_exact_string(r, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Beam's timeline for its test vectors: one generator at 10 000
    /// events/s from 2015-07-15.
    fn beam() -> Generator {
        Generator {
            seed: 0,
            flink: false,
            timeline: Timeline {
                anchor_event: 0,
                anchor_ms: 1_436_918_400_000,
                rate: 10_000,
            },
        }
    }

    fn person_line(e: i64) -> String {
        let p = beam().person(e);
        format!(
            "P|{e}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
            p.id,
            p.name,
            p.email_address,
            p.credit_card,
            p.city,
            p.state,
            p.date_time,
            p.extra.len(),
            &p.extra[..20]
        )
    }

    fn auction_line(e: i64) -> String {
        let a = beam().auction(e);
        format!(
            "A|{e}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
            a.id,
            a.item_name,
            a.description,
            a.initial_bid,
            a.reserve,
            a.date_time,
            a.expires,
            a.seller,
            a.category,
            a.extra.len(),
            &a.extra[..20]
        )
    }

    fn bid_line(e: i64) -> String {
        let b = beam().bid(e);
        format!(
            "B|{e}|{}|{}|{}|{}|{}|{}",
            b.auction,
            b.bidder,
            b.price,
            b.date_time,
            b.extra.len(),
            &b.extra[..20]
        )
    }

    /// Lines printed by Beam's generator (a Java transcription of it, run
    /// on Java 17) for these events.
    #[test]
    fn events_are_beams_byte_for_byte() {
        let got = [
            person_line(0),
            auction_line(1),
            auction_line(3),
            bid_line(4),
            bid_line(5),
            bid_line(6),
            bid_line(7),
            person_line(50),
            auction_line(51),
            person_line(100),
            person_line(1000),
        ];
        let want = [
            "P|0|1000|Peter Jones|nhd@xcat.com|7241 7320 9143 4888|Portland|WY|1436918400000|156|WN_HS_bnpkkiwhwana_L",
            "A|1|1000|wkx mgee|eszpqxtdxrvwmmywkmogoahf|28873|29448|1436918400000|1436918400011|1000|13|346|zcurskufssowmihzpmZH",
            "A|3|1002|gxycmhtobprpd|ybjpocsabdbtiqzhbupw ihlxbsqjkmp lbupz bcqnghg fojwfqs|267|422398|1436918400000|1436918400001|1000|10|407|JKSLMTmulfbwHKXUXSzt",
            "B|4|1000|1001|32530001|1436918400000|77|fdiysaV^]NLVsbolvyqw",
            "B|5|1000|1009|468715|1436918400000|75|kpbrykRZJVMWeuyfegsy",
            "B|6|1000|1001|300435|1436918400000|71|H]ITTZpgivopmwyooulz",
            "B|7|1000|1001|3126206|1436918400000|66|byxajvVIJV^VKUUY`RJa",
            "P|50|1001|Sarah Smith|f  y@yumv.com|0892 2755 1923 0591|Los Angeles|ID|1436918400005|153|`RT]WInnxtneWPLPHOyw",
            "A|51|1003|ap yurxvft|vrnwqqis djcnffvmce soukxctnrr scxvzjf|5037490|5980861|1436918400005|1436918400008|1000|11|330|KMIZKI]V]TY\\`aMLVVob",
            "P|100|1002|Saul Abrams|ved@prha.com|2773 1119 8653 0428|Bend|WA|1436918400010|172|ocdrufzegtsvmajjshzc",
            "P|1000|1020|Walter Abrams|alkt@csxs.com|0871 2589 0002 1693|San Francisco|CA|1436918400100|140|KUH^JV`P^X\\YRIS`QVaq",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn kinds_come_in_beams_proportions() {
        let kinds: Vec<Kind> = (0..50).map(Kind::of).collect();
        assert_eq!(kinds.iter().filter(|k| **k == Kind::Person).count(), 1);
        assert_eq!(kinds.iter().filter(|k| **k == Kind::Auction).count(), 3);
        assert_eq!(kinds[0], Kind::Person);
        assert_eq!(kinds[1..4], [Kind::Auction; 3]);
        // Bids name existing auctions (or one of the next few), and every
        // bid's padding is 54 to 81 bytes.
        for e in (0..20_000).filter(|e| Kind::of(*e) == Kind::Bid) {
            let b = beam().bid(e);
            assert!(b.auction - FIRST_AUCTION_ID <= last_auction(e) + AUCTION_ID_LEAD);
            assert!((54..=81).contains(&b.extra.len()), "{}", b.extra.len());
        }
    }

    #[test]
    fn flinks_generator_adds_a_channel_and_url_to_each_bid() {
        let flink = Generator {
            flink: true,
            ..beam()
        };
        let bids: Vec<i64> = (0..20_000).filter(|e| Kind::of(*e) == Kind::Bid).collect();
        let mut hot = 0;
        for &e in &bids {
            let (b, f) = (beam().bid(e), flink.bid(e));
            // The draws before the channel are Beam's; the channel comes
            // after the price, so only the padding differs.
            assert_eq!(
                (f.auction, f.bidder, f.price),
                (b.auction, b.bidder, b.price)
            );
            assert!(b.channel.is_none());
            let c = f
                .channel
                .clone()
                .unwrap_or_else(|| panic!("bid {e} has no channel"));
            assert!(c.url.starts_with("https://www.nexmark.com/"), "{}", c.url);
            assert!(c.url.contains("item.htm?query=1"), "{}", c.url);
            if HOT_CHANNELS.contains(&c.name.as_str()) {
                hot += 1;
            } else {
                let n: i32 = c.name.strip_prefix("channel-").unwrap().parse().unwrap();
                assert!((0..CHANNELS).contains(&n));
            }
            // The same event, the same channel and URL, in every run.
            assert_eq!(flink.bid(e), f);
        }
        // Half the bids come through a hot channel (1 - 1/HOT_CHANNELS_RATIO).
        let share = f64::from(hot) / bids.len() as f64;
        assert!((0.45..0.55).contains(&share), "{share}");
        // A channel's URL is the same whichever bid it comes with.
        assert_eq!(flink.channel(42), flink.channel(42));
        assert_ne!(flink.channel(42).url, flink.channel(43).url);
    }

    #[test]
    fn another_seed_gives_other_rows_of_the_same_shape() {
        let other = Generator { seed: 7, ..beam() };
        assert_ne!(other.bid(4), beam().bid(4));
        assert_eq!(other.person(50).id, beam().person(50).id);
        assert_eq!(other.bid(4).date_time, beam().bid(4).date_time);
    }
}
